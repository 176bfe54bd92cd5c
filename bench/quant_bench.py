"""The Q8_0 matmul (engine/kernels/quant.py) beside float32 ``F.linear`` on the
dequantized weight, per row count: the compiled kernel, the torch-only path, and
``F.linear``. Prints a markdown table (median of ``--repeat`` calls, ms).

    python bench/quant_bench.py --shapes 2048x8192,8192x2048 --rows 1,8,32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from engine.kernels import quant


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="2048x8192,8192x2048,2048x2048", help="N x K weights, comma-separated")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"compiled kernel: {quant.compiled_isa()}, {args.threads} threads")
    print("| weight N x K | rows | Q8_0 compiled ms | Q8_0 torch-only ms | F.linear f32 ms | f32 / compiled |")
    print("|---|---:|---:|---:|---:|---:|")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        qs, d = quant.q8_0_quantize(torch.randn(n, k) * 0.05)
        w = quant.q8_0_dequantize(qs, d)
        for m in (int(r) for r in args.rows.split(",")):
            print(row(n, k, m, qs, d, w, args.repeat))


def row(n: int, k: int, m: int, qs: torch.Tensor, d: torch.Tensor, w: torch.Tensor, repeat: int) -> str:
    x = torch.randn(m, k)
    c = None
    if quant.compiled_isa():
        c = median_ms(lambda: quant.q8_0_linear(x, qs, d, compiled=True), repeat)
    t = median_ms(lambda: quant.q8_0_linear(x, qs, d, compiled=False), repeat)
    f = median_ms(lambda: F.linear(x, w), repeat)
    cs = f"{c:.2f}" if c is not None else "—"
    ratio = f"{f / c:.2f}x" if c is not None else "—"
    return f"| {n} x {k} | {m} | {cs} | {t:.2f} | {f:.2f} | {ratio} |"


if __name__ == "__main__":
    main()
