"""Speculation on a hybrid memory (issue 52): decoding with proposals verified from a
held checkpoint, against plain decoding, on one GGUF, in one process. Prints JSON.

    python bench/spec_hybrid.py MODEL.gguf [--new 128 --window 8 --spoil 4]

A random-weight model never repeats its context, so n-gram lookup finds nothing to
propose on it; what lookup proposes on repeating code (text the output copies) is
stood in for by the plain run's own continuation, ``--window`` tokens a proposal, with
one token in every ``--spoil`` proposals made wrong (a rejection and a rollback to the
held checkpoint each time; 0: none). Output must be the plain run's token for token;
reported: tok/s of each (decode only, after the prompt) and their ratio.

A random model's logits are nearly flat over 151,936 tokens, so the last bits of float
arithmetic (a verify step's rows against single-token steps) decide its greedy picks;
``--logit-scale`` (default 30) multiplies the final norm's scale so that the picks
have margins as a trained model's do (the model is otherwise as loaded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine import Engine, SamplingParams  # noqa: E402
from engine.core.speculation import Speculation  # noqa: E402
from engine.kernels import blocks  # noqa: E402


class Replay:
    """Proposes what the plain run produced, spoiling one proposal in ``spoil``."""

    def __init__(self, answer: list[int], spoil: int):
        self.answer, self.spoil, self.calls = answer, spoil, 0

    def propose(self, wants):
        drafts = []
        for seq, n, _ in wants:
            self.calls += 1
            k = len(seq.output_ids)
            draft = list(self.answer[k : k + n])
            if draft and self.spoil and self.calls % self.spoil == 0:
                draft[len(draft) // 2] = (draft[len(draft) // 2] + 1) % 256
            drafts.append(draft)
        return drafts


def decode(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], float, object]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seq = engine.add_sequence(prompt, params, seq_id=0)
    while seq.n_computed < len(prompt) - 1 or not seq.output_ids:  # the prompt, then the first token
        engine.step()
    t0 = time.perf_counter()
    while engine.has_work:
        engine.step()
    return seq.output_ids, (len(seq.output_ids) - 1) / (time.perf_counter() - t0), seq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--spoil", type=int, default=4)
    ap.add_argument("--logit-scale", type=float, default=30.0)
    ap.add_argument("--activations", choices=["int8", "int16", "float"], default="int8")
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    args = ap.parse_args()
    blocks.ACTIVATIONS = args.activations  # how the block kernels round activations (engine/kernels/blocks.py)
    engine = Engine.from_pretrained(args.model, n_ctx=4096, n_seq_max=1, repack=args.repack)
    norm = engine.model.model.norm.weight  # Qwen3.5's zero-centred scale: (1 + w)
    with torch.no_grad():
        norm.copy_((1 + norm) * args.logit_scale - 1)
    prompt = list(range(10, 138))
    plain, plain_tps, _ = decode(engine, prompt, args.new)
    engine.memory.seq_rm(0)
    engine.speculation = Speculation(args.window, draft=Replay(plain, args.spoil))
    fast, fast_tps, seq = decode(engine, prompt, args.new)
    print(json.dumps({
        "model": Path(args.model).name, "new": args.new, "window": args.window, "spoil_every": args.spoil,
        "logit_scale": args.logit_scale, "activations": args.activations, "repack": args.repack,
        "plain_tok_s": round(plain_tps, 2), "spec_tok_s": round(fast_tps, 2), "ratio": round(fast_tps / plain_tps, 2),
        "identical": plain == fast, "proposed": seq.n_drafted, "accepted": seq.n_draft_accepted,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
