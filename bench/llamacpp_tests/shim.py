"""``llama-server`` as llama.cpp's server tests start it, served by slotserve: the
tests' flags are passed on, the Hugging Face models they name (no network here) are
mapped to local checkpoints, and flags slotserve does not have (GPU layers, flash
attention, ...) are dropped with one line on stderr.

    LLAMA_SERVER_BIN_PATH=bench/llamacpp_tests/llama-server pytest unit/test_basic.py
"""

from __future__ import annotations

import os
import sys

from engine import DEMO_MODEL

MODELS = {  # a preset's repository or file (a substring) -> the local checkpoint (else SHIM_MODEL: the demo model)
    "stories260K-infill": os.environ.get("SHIM_FIM_MODEL", str(DEMO_MODEL)),  # a tokenizer with FIM tokens
    "tinygemma3": os.environ.get("SHIM_VISION_MODEL", str(DEMO_MODEL)),  # a Gemma 3 that takes images
}
VALUELESS = {"--offline", "--cont-batching", "--no-mmproj", "--no-models-autoload",
             "--backend_sampling", "--reranking"}  # fmt: skip


def translate(argv: list[str]) -> list[str]:
    out, repo, i = [], "", 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--hf-repo", "--hf-file", "-hf", "-hff"):
            repo += " " + argv[i + 1]
            i += 2
            continue
        if arg in VALUELESS:
            i += 1
            continue
        out.append(arg)
        i += 1
    if "-m" not in out and "--model" not in out:
        model = next(
            (path for key, path in MODELS.items() if key in repo), os.environ.get("SHIM_MODEL", str(DEMO_MODEL))
        )
        out += ["--model", model]
    return out


def main() -> int:
    from server.cli import build_parser

    parser = build_parser()
    args, unknown = parser.parse_known_args(["serve", *translate(sys.argv[1:])])
    if unknown:
        print(f"shim: slotserve has no {' '.join(unknown)}; dropped", file=sys.stderr)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
