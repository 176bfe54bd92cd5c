"""Offline generation throughput: slotserve's engine beside transformers' generate.

    python bench/engine_bench.py                 # the issue's shape: ~88M-param Llama, fp32
    python bench/engine_bench.py --small         # a quick smoke run
    python bench/engine_bench.py --profile       # also: where a decode step spends its time

Both run the same random checkpoint in the same process, one after the other, on the
same threads; figures are ratios from one run. Each batch size: prompts of --prompt
tokens, --new greedy tokens each (EOS ignored), wall time including prefill.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

SHAPE = dict(
    vocab_size=8000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)
SMALL = dict(SHAPE, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4)
# ~1B Llama shape (issue 25's peer rows): where reading the weights dominates a decode step
ONE_B = dict(
    SHAPE, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8
)
SHAPES = {"88m": SHAPE, "small": SMALL, "1b": ONE_B}


def build_checkpoint(folder: Path, shape: dict) -> int:
    import sys

    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from checkpoints import write_byte_tokenizer

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    model.save_pretrained(folder)
    write_byte_tokenizer(folder)
    return sum(p.numel() for p in model.parameters())


def run_ours(
    folder: Path, prompts: list[list[int]], n_new: int, linear: str = "auto", quantization: str | None = None
) -> float:
    from engine import Engine, SamplingParams

    engine = Engine.from_pretrained(
        str(folder),
        n_ctx=len(prompts) * (len(prompts[0]) + n_new + 16),
        n_seq_max=len(prompts),
        linear=linear,
        quantization=quantization,
    )
    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    engine.generate([prompts[0][:8]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    dt = time.perf_counter() - t0
    assert all(len(g.token_ids) == n_new for g in out)
    return len(prompts) * n_new / dt


def run_hf(folder: Path, prompts: list[list[int]], n_new: int) -> float:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:1, :8], max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, **kwargs)
        dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + n_new
    return len(prompts) * n_new / dt


def profile_decode(folder: Path, batch: int, prompt_len: int, linear: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    from engine import Engine, SamplingParams

    engine = Engine.from_pretrained(str(folder), n_ctx=batch * (prompt_len + 64), n_seq_max=batch, linear=linear)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i in range(batch):
        engine.add_sequence(list(range(1, prompt_len + 1)), params, seq_id=i)
    while any(s.n_pending > 1 for s in engine.running):
        engine.step()
    for _ in range(3):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            engine.step()
    print(f"\nprofile: 10 decode steps, batch {batch}, context ~{prompt_len}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--linear", default="auto", choices=["auto", "torch", "onednn"], help="engine's matmul path")
    ap.add_argument("--quantization", default=None, choices=["q8_0"], help="quantize the linears at load")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/plot.py reads it)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        n_params = build_checkpoint(folder, SMALL if args.small else SHAPE)
        print(f"model: {n_params / 1e6:.1f}M parameters, float32, torch threads {torch.get_num_threads()}")
        print(f"{'batch':>5} {'slotserve tok/s':>16} {'transformers tok/s':>19} {'ratio':>6}")
        gen = torch.Generator().manual_seed(0)
        for batch in [int(b) for b in args.batches.split(",")]:
            prompts = torch.randint(1, 250, (batch, args.prompt), generator=gen).tolist()
            ours = run_ours(folder, prompts, args.new, args.linear, args.quantization)
            theirs = run_hf(folder, prompts, args.new)
            print(f"{batch:>5} {ours:>16.1f} {theirs:>19.1f} {ours / theirs:>6.2f}x", flush=True)
            rows.append({"batch": batch, "slotserve_tok_s": ours, "transformers_tok_s": theirs})
        if args.json:
            meta = {"params_m": n_params / 1e6, "threads": torch.get_num_threads(), "prompt": args.prompt}
            args.json.write_text(json.dumps({**meta, "new": args.new, "rows": rows}, indent=1))
        if args.profile:
            profile_decode(folder, 8, args.prompt, args.linear)


if __name__ == "__main__":
    main()
