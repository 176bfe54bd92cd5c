"""Structured outputs: which grammar library, and what constrained rows cost a step.

    python bench/grammar_bench.py libraries     # llguidance vs xgrammar vs outlines-core
    python bench/grammar_bench.py step          # engine decode step, 32 rows, 0 or 8 constrained

``libraries``: for each library importable here (the others are skipped with the
reason), the time to compile a JSON schema for the demo tokenizer and the time of one
token mask along a fixed valid output, median over its tokens. xgrammar and
outlines-core are not dependencies: install them to a scratch folder for this
(``pip install --target /tmp/gx --no-deps xgrammar apache-tvm-ffi outlines-core`` and
``PYTHONPATH=/tmp/gx``).

``step``: 32 sequences decode together on the demo model; the median step time with
no constrained row, then with 8 rows under a JSON-schema constraint whose masks are
computed while the forward runs. Repeated ``--rounds`` times, alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
OUTPUT = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"]}'


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def bench_llguidance(tok_json: str, vocab: int, eos: list[int], ids: list[int]) -> dict:
    import llguidance as llg
    import llguidance.torch as lt

    t0 = time.perf_counter()
    lltok = llg.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos)
    t1 = time.perf_counter()
    from engine.sampling.grammar import JSON_OPTIONS

    grammar = llg.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_OPTIONS)
    matcher = llg.LLMatcher(lltok, grammar)
    t2 = time.perf_counter()
    mask = lt.allocate_token_bitmask(1, vocab)
    times = []
    for tok in ids:
        t = time.perf_counter()
        lt.fill_next_token_bitmask(matcher, mask)
        times.append(time.perf_counter() - t)
        assert matcher.consume_token(tok), matcher.get_error()
    return {"tokenizer_ms": (t1 - t0) * 1000, "compile_ms": (t2 - t1) * 1000, "mask_ms": _median_ms(times)}


def bench_xgrammar(folder: Path, vocab: int, ids: list[int]) -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    matcher = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for tok in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - t)
        assert matcher.accept_token(tok)
    return {"tokenizer_ms": (t1 - t0) * 1000, "compile_ms": (t2 - t1) * 1000, "mask_ms": _median_ms(times)}


def bench_outlines(tokenizer, eos: int, ids: list[int]) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    for i in range(tokenizer.hf.get_vocab_size()):
        if i != eos:
            pieces.setdefault(tokenizer.hf.decode([i]), []).append(i)  # decoded text of each token
    vocabulary = Vocabulary(eos, pieces)
    t1 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern=" ?"), vocabulary)
    guide = Guide(index)
    t2 = time.perf_counter()
    times = []
    for tok in ids:
        t = time.perf_counter()
        allowed = guide.get_tokens()
        times.append(time.perf_counter() - t)
        if tok not in allowed:  # its tokenization of the output may differ from ours
            break
        guide.advance(tok)
    return {"tokenizer_ms": (t1 - t0) * 1000, "compile_ms": (t2 - t1) * 1000, "mask_ms": _median_ms(times)}


def libraries() -> None:
    from engine import DEMO_MODEL
    from engine.models.config import load_model_config
    from engine.text.tokenizer import Tokenizer

    cfg = load_model_config(Path(DEMO_MODEL))
    tok = Tokenizer.from_folder(Path(DEMO_MODEL), cfg.eos_token_ids)
    ids = tok.encode(OUTPUT, add_special=False)
    eos = sorted(tok.eos_ids)
    runs = {
        "llguidance": lambda: bench_llguidance(tok.hf.to_str(), cfg.vocab_size, eos, ids),
        "xgrammar": lambda: bench_xgrammar(Path(DEMO_MODEL), cfg.vocab_size, ids),
        "outlines-core": lambda: bench_outlines(tok, eos[0], ids),
    }
    print(f"demo tokenizer: {cfg.vocab_size} tokens; output of {len(ids)} tokens")
    print(f"{'library':<14} {'tokenizer ms':>13} {'compile ms':>11} {'mask ms (p50)':>14}")
    for name, run in runs.items():
        try:
            r = run()
        except ImportError as exc:
            print(f"{name:<14} skipped: {exc}")
            continue
        print(f"{name:<14} {r['tokenizer_ms']:>13.2f} {r['compile_ms']:>11.2f} {r['mask_ms']:>14.4f}")


def step(rounds: int, steps: int) -> None:
    import torch

    from engine import DEMO_MODEL, Engine, SamplingParams

    engine = Engine.from_pretrained(str(DEMO_MODEL), n_seq_max=32, n_ctx=32 * 512)
    open_array = {"type": "array", "items": {"type": "integer"}}  # never finishes on its own
    constraint = engine.grammars.compile("json_schema", open_array)

    def median_step(n_constrained: int) -> float:
        engine.memory.seq_rm(-1)
        for i in range(32):
            c = constraint if i < n_constrained else None
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=10_000, ignore_eos=True, constraint=c)
            engine.add_sequence(engine.tokenizer.encode(f"row {i}: ["), params, i)
        while any(s.n_pending > 1 for s in engine.running):
            engine.step()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        for seq in list(engine.running):
            engine.abort(seq)
        return _median_ms(times)

    print(f"torch threads {torch.get_num_threads()}; median decode step of 32 rows over {steps} steps")
    for r in range(rounds):
        plain, mixed = median_step(0), median_step(8)
        print(f"round {r}: 0 constrained {plain:.1f} ms, 8 constrained {mixed:.1f} ms ({mixed / plain:.3f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["libraries", "step"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    libraries() if args.what == "libraries" else step(args.rounds, args.steps)


if __name__ == "__main__":
    main()
