"""The packed integer kernels (engine/kernels/csrc/packed_impl.inc) per type, row count
and kernel unit: ms per call of ``packed_linear_on`` on one N x K weight of random blocks
(valid scales), its weight bytes per second, and the rate beside Q4_0's (same values per
second = 1.0x). Prints a markdown table.

    python bench/packed_bench.py                                   # 151936 x 1024 (a vocabulary head)
    python bench/packed_bench.py --shape 4096x4096 --rows 1,8 --types Q6_K,Q5_K,Q4_K
    SLOTSERVE_WIDE=0 python bench/packed_bench.py --isas avx512     # the 256-bit AVX-512 tiles
"""

from __future__ import annotations

import argparse
import functools

import gguf
import torch
from quant_bench import median_ms, random_blocks

from engine.kernels import blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="151936x1024", help="N x K")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--types", default="Q4_0,Q8_0,MXFP4,Q4_K,Q5_K,Q6_K,IQ4_XS")
    ap.add_argument("--isas", default="", help="kernel units, comma-separated (default: every one this CPU runs)")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    ext = blocks._blocks
    if ext is None:
        raise SystemExit("the compiled kernels are not built")
    n, k = (int(v) for v in args.shape.split("x"))
    isas = args.isas.split(",") if args.isas else [i for i in ext.isas() if i != "portable"]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{n} x {k}, threads {torch.get_num_threads()}, wide 512-bit tiles: {ext.wide()}")
    print("| type | unit | rows | ms | GB/s | rate / Q4_0's |")
    print("|---|---|---|---|---|---|")
    q4_0: dict[tuple[str, int], float] = {}
    for name in args.types.split(","):
        qtype = gguf.GGMLQuantizationType[name]
        w = random_blocks(qtype, n, k).pack()
        for isa in isas:
            for m in rows:
                call = functools.partial(ext.packed_linear_on, torch.randn(m, k), [w.data], [int(qtype)], isa)
                ms = median_ms(call, args.repeat)
                if name == "Q4_0":
                    q4_0[isa, m] = ms
                base = q4_0.get((isa, m))
                rate = f"{base / ms:.2f}x" if base else "-"
                print(f"| {name} | {isa} | {m} | {ms:.2f} | {w.data.numel() / ms / 1e6:.1f} | {rate} |")
        del w


if __name__ == "__main__":
    main()
