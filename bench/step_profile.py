"""Where one engine step spends its time: decode steps at several batch sizes.

    python bench/step_profile.py                         # bench checkpoint, per-stream
    python bench/step_profile.py --layout unified --batches 1,32 --profile
    python bench/step_profile.py --cache-type q8_0 --context 2048      # a smaller attention cache

For each batch size: every sequence holds a ``--context``-token prompt, then
``--steps`` decode steps are timed one by one (median and p90 reported). "linears" is
the time of the step's matmuls alone, timed on the same shapes outside the model, so
"rest" = step - linears is what the model, the memory view, sampling and Python add.
``--profile`` prints torch.profiler's table of one batch size's steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_engine(
    folder: Path, batch: int, context: int, layout: str, linear: str, mmap: bool = True, cache_type: str | None = None
):
    from engine import Engine

    n_ctx = batch * (context + 256)
    return Engine.from_pretrained(
        str(folder),
        n_ctx=n_ctx,
        n_seq_max=batch,
        linear=linear,
        kv_unified=layout == "unified",
        mmap=mmap,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
    )


def fill(engine, batch: int, context: int) -> None:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        engine.add_sequence(torch.randint(1, 250, (context,), generator=gen).tolist(), params, seq_id=i)
    while any(s.n_pending > 1 for s in engine.running):
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()


def time_steps(engine, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        engine.step()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_linears(engine, rows: int, reps: int = 5) -> float:
    """ms for one pass of every linear of the model at ``rows`` rows (LM head: one
    row per sequence, as in a decode step)."""
    mods = [m for name, m in engine.model.named_modules() if name and hasattr(m, "out_features")]
    xs = [torch.randn(rows, m.in_features) for m in mods]
    with torch.inference_mode():
        for m, x in zip(mods, xs):
            m(x)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for m, x in zip(mods, xs):
                m(x)
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="checkpoint folder (default: engine_bench's, built in a temp dir)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layout", default="stream", choices=["stream", "unified"])
    ap.add_argument("--linear", default="auto", choices=["auto", "torch", "onednn"])
    ap.add_argument("--no-mmap", action="store_true", help="read a GGUF's weights instead of mapping them")
    ap.add_argument("--cache-type", default=None, help="-ctk and -ctv: f32, f16, bf16, q8_0 (default: the model's)")
    ap.add_argument("--profile", type=int, default=0, metavar="BATCH", help="profile this batch size's steps")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            from engine_bench import SHAPE, build_checkpoint

            folder = Path(tmp)
            build_checkpoint(folder, SHAPE)
        cache = args.cache_type or "the model's dtype"
        print(f"threads {torch.get_num_threads()}, layout {args.layout}, context ~{args.context}, cache {cache}")
        print(f"{'batch':>5} {'step p50 ms':>12} {'p90':>7} {'tok/s':>7} {'linears ms':>11} {'rest ms':>8}")
        for batch in [int(b) for b in args.batches.split(",")]:
            engine = make_engine(
                folder, batch, args.context, args.layout, args.linear, not args.no_mmap, args.cache_type
            )
            fill(engine, batch, args.context)
            times = time_steps(engine, args.steps)
            p50 = statistics.median(times)
            p90 = sorted(times)[int(0.9 * (len(times) - 1))]
            lin = time_linears(engine, batch)
            print(f"{batch:>5} {p50:>12.1f} {p90:>7.1f} {batch / p50 * 1e3:>7.1f} {lin:>11.1f} {p50 - lin:>8.1f}")
            if args.profile == batch:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    time_steps(engine, 10)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            del engine


if __name__ == "__main__":
    main()
