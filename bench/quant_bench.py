"""The block matmuls (engine/kernels/blocks.py) beside float32 ``F.linear`` on the
decoded weight, per type and row count: the compiled kernel on 16-bit activations (the
default), on float activations, on int8 activations (llama.cpp's way), and ``F.linear``. Prints a markdown
table (median of ``--repeat`` calls, ms). Weights are random blocks (valid scales).

    python bench/quant_bench.py --shapes 2048x8192,8192x2048 --rows 1,8,32 --types Q8_0,Q4_K,Q6_K

``--isas avx2,avx512`` times the rounded-activation paths on each named kernel unit in
the same run (the units this CPU runs: ``_blocks.isas()``), the last ratio being the first
unit's 16-bit time over the last's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from engine.kernels import blocks


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def random_blocks(qtype: gguf.GGMLQuantizationType, n: int, k: int) -> blocks.BlockWeight:
    """Random bytes with every float16 field of the block set to a small valid scale."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    w = (np.random.default_rng(0).standard_normal((n, k)) * 0.05).astype(np.float32)
    if qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        raw = gguf.quants.quantize(w, qtype)
    else:
        raw = np.random.default_rng(1).integers(0, 256, (n, k // values, size), dtype=np.uint8)
        halves = {"Q2_K": [80, 82], "Q3_K": [108], "Q6_K": [208]}.get(qtype.name, [0, 2] if "K" in qtype.name else [0])
        for off in halves:
            raw[:, :, off : off + 2] = np.full((n, k // values, 1), 0.002, np.float16).view(np.uint8)
    return blocks.BlockWeight(qtype, torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)), k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="2048x8192,8192x2048", help="N x K weights, comma-separated")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isas", default="", help="kernel units to compare, e.g. avx2,avx512 (default: the best only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"compiled kernels: {blocks.compiled_isa()}, {args.threads} threads")
    if args.isas:
        compare_isas(args, args.isas.split(","))
        return
    modes = list(blocks.ACT_MODES)
    heads = " | ".join(f"{a} acts ms" for a in modes)
    print(f"| weight N x K | type | rows | {heads} | F.linear f32 ms | f32 / int16 |")
    print("|---|---|---:|" + "---:|" * (len(modes) + 2))
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        dense = torch.randn(n, k)
        for name in args.types.split(","):
            w = random_blocks(gguf.GGMLQuantizationType[name], n, k)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k)
                ms = {
                    a: median_ms(lambda x=x, w=w, a=a: blocks.block_linear(x, [w], compiled=True, acts=a), args.repeat)
                    for a in modes
                }
                f = median_ms(lambda x=x, dense=dense: F.linear(x, dense), args.repeat)
                cells = " | ".join(f"{ms[a]:.2f}" for a in modes)
                print(f"| {n} x {k} | {name} | {m} | {cells} | {f:.2f} | {f / ms['int16']:.2f}x |")


def compare_isas(args, isas: list[str]) -> None:
    """int16 and int8 activations on each kernel unit, same weights and inputs."""
    from engine.kernels import _blocks

    cols = [(a, isa) for a in ("int16", "int8") for isa in isas]
    heads = " | ".join(f"{a} {isa} ms" for a, isa in cols)
    print(f"| weight N x K | type | rows | {heads} | int16 {isas[0]} / {isas[-1]} |")
    print("|---|---|---:|" + "---:|" * (len(cols) + 1))
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for name in args.types.split(","):
            w = random_blocks(gguf.GGMLQuantizationType[name], n, k)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k)

                def call(a, isa, x=x, w=w):
                    return _blocks.block_linear_on(x, [w.data], [int(w.qtype)], blocks.ACT_MODES[a], isa)

                ms = {(a, isa): median_ms(lambda a=a, isa=isa: call(a, isa), args.repeat) for a, isa in cols}
                cells = " | ".join(f"{ms[c]:.2f}" for c in cols)
                ratio = ms[("int16", isas[0])] / ms[("int16", isas[-1])]
                print(f"| {n} x {k} | {name} | {m} | {cells} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
