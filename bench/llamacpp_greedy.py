"""Greedy continuations of a GGUF file by llama.cpp and by slotserve, side by side, with
transformers' top-2 margin at the first step where they part (issue 66: a GGUF answers
as llama-server on the same file).

    python bench/llamacpp_greedy.py FILE.gguf [--folder HF_FOLDER] [--completion PATH] [-n 24]

llama.cpp runs as ``llama-completion`` of the pinned tree (float32 KV cache, flash
attention off, temperature 0); its output bytes are compared with the bytes of
slotserve's tokens. With ``--folder`` (the folder the file was converted from),
transformers' margin between its best two tokens is printed where the two part: a
margin near zero is float noise, a large one a difference in the model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, item):", "The quick brown",
           "Slots keep"]  # fmt: skip


def llama_bytes(binary: str, gguf: Path, prompt: str, n: int) -> bytes:
    cmd = [binary, "-m", str(gguf), "-p", prompt, "-n", str(n), "--temp", "0", "--ignore-eos", "-no-cnv",
           "--no-warmup", "-t", "2", "--simple-io", "--no-display-prompt", "-c", "512", "-ctk", "f32", "-ctv", "f32",
           "-fa", "off"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=300).stdout
    return out[:-2] if out.endswith(b"\n\n") else out  # the tool ends its output with a blank line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--folder", type=Path)
    ap.add_argument("--completion", default=str(Path.home() / ".cache/slotserve-peer/llama-completion"))
    ap.add_argument("-n", type=int, default=24)
    args = ap.parse_args()
    import torch

    from engine import Engine, SamplingParams

    engine = Engine.from_pretrained(str(args.gguf), n_seq_max=1)
    tok = engine.tokenizer
    model = None
    if args.folder:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
    same = 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=args.n, ignore_eos=True))[0].token_ids
        text = [tok.token_bytes(t) for t in ours]
        theirs = llama_bytes(args.completion, args.gguf, prompt, args.n)
        if b"".join(text) == theirs:
            same += 1
            print(f"{prompt!r}: same")
            continue
        step = next(i for i in range(len(text)) if not theirs.startswith(b"".join(text[: i + 1])))
        margin = ""
        if model is not None:
            with torch.no_grad():
                top = model(torch.tensor([ids + ours[:step]])).logits[0, -1].topk(2).values
            margin = f", transformers' top-2 margin there {float(top[0] - top[1]):.4f}"
        print(f"{prompt!r}: parts at step {step}{margin}")
    print(f"{same} of {len(PROMPTS)} continuations the same")


if __name__ == "__main__":
    main()
