"""``llama-server`` as llama.cpp's server tests start it, served by slotserve: the
tests' flags are passed on, the Hugging Face models they name (no network here) are
mapped to local checkpoints, and flags slotserve does not have (GPU layers, flash
attention, ...) are dropped with one line on stderr.

Started with no model (the router preset), it is slotserve's router over a Hugging
Face hub cache at ``LLAMA_CACHE``, where the repositories unit/test_router.py names
are links to one tiny GGUF (``SHIM_ROUTER_GGUF``); ``LLAMA_SERVER_DEBUG_FAKE_TIMING``
becomes the router's 2 s test delay on each load and request.

    LLAMA_SERVER_BIN_PATH=bench/llamacpp_tests/llama-server pytest unit/test_basic.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from engine import DEMO_MODEL

MODELS = {  # a preset's repository or file (a substring) -> the local checkpoint (else SHIM_MODEL: the demo model)
    "stories260K-infill": os.environ.get("SHIM_FIM_MODEL", str(DEMO_MODEL)),  # a tokenizer with FIM tokens
    "tinygemma3": os.environ.get("SHIM_VISION_MODEL", str(DEMO_MODEL)),  # a Gemma 3 that takes images
}
ROUTER_REPOS = {  # the router tests' cached repositories -> a file name in each
    "ggml-org/tinygemma3-GGUF": "tinygemma3-Q8_0.gguf",
    "ggml-org/test-model-stories260K": "stories260K-F32.gguf",
    "ggml-org/test-model-stories260K-infill": "stories260K-infill-F32.gguf",
}
VALUELESS = {"--offline", "--cont-batching", "--no-mmproj",
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
    if not repo.strip() and "-m" not in out and "--model" not in out and "--models-dir" not in out:
        return out + ["--models-dir", str(hub_cache())]
    if "-m" not in out and "--model" not in out:
        model = next(
            (path for key, path in MODELS.items() if key in repo), os.environ.get("SHIM_MODEL", str(DEMO_MODEL))
        )
        out += ["--model", model]
    return out


def hub_cache() -> Path:
    """``LLAMA_CACHE`` as a hub cache holding ROUTER_REPOS (links to SHIM_ROUTER_GGUF)."""
    root = Path(os.environ.get("LLAMA_CACHE", "tmp")).absolute()
    for repo, file in ROUTER_REPOS.items():
        folder = root / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text("0" * 40)
        link = folder / "snapshots" / ("0" * 40) / file
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.environ["SHIM_ROUTER_GGUF"])
    return root


def main() -> int:
    from server.cli import build_parser

    if os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"):
        os.environ["SLOTSERVE_ROUTER_DEBUG_DELAY_S"] = "2"
    parser = build_parser()
    args, unknown = parser.parse_known_args(["serve", *translate(sys.argv[1:])])
    if unknown:
        print(f"shim: slotserve has no {' '.join(unknown)}; dropped", file=sys.stderr)
    args.argv = [a for a in translate(sys.argv[1:]) if a not in unknown]  # router mode: the children's flags
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
