"""Weights kept in GGUF blocks (engine/kernels/blocks.py, csrc/): every kept type decodes
to exactly what ``gguf`` reads from the same bytes, and each matmul path (the compiled
kernel on this CPU's instruction set, the portable one, the torch-only tiles) stays
within a bound derived from the activations' rounding, against float64 on the decoded
weight.

Bound: the compiled kernels round each block of an activation row to integers, with step
dx = max|x_block| / L: blocks of 256 and L = 16383 on the default 16-bit path, blocks of
32 and L = 127 on the int8 path. Each value moves by at most dx / 2, and the kernels
compute the exact dot product of the weight with those rounded values (a weight value is
scale * q + offset; the offset meets the sum of the rounded values): an output moves by
at most sum over values of dx / 2 * |w|, plus float32 accumulation (1e-5 relative). The
float path, 16-bit float weights and the torch-only path do not round the activations:
float32 accumulation only.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from block_packers import pack
from unavailable import unavailable

from engine.kernels import blocks
from engine.kernels.blocks import KEPT, BlockLinear, BlockWeight, block_linear

FLOATS = {gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
TYPES = sorted(KEPT, key=int)
pytestmark = pytest.mark.usefixtures("kernel_threads")  # rows split over threads


@pytest.fixture(scope="module")
def compiled():
    if blocks.compiled_isa() is None:
        unavailable("the compiled kernels are not built (pip install -e . with a C++ compiler)", "SLOTSERVE_SKIP_EXT")
    return blocks._blocks


def _weight(n: int, k: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    w = (g.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, :256] = 0  # an all-zero block (scale 0)
    w[-1, -32:] *= 40  # a block with outliers
    w[1 % n, :32] = np.abs(w[1 % n, :32]) + 0.1  # a block all positive (offset types: minimum above 0)
    return w


def _blocks(qtype, n: int, k: int, seed: int = 0) -> tuple[BlockWeight, torch.Tensor]:
    """(weight in blocks, what gguf reads from its bytes [n, k] float32)."""
    raw = pack(_weight(n, k, seed), qtype)
    expected = gguf.quants.dequantize(raw, qtype).reshape(n, k).astype(np.float32)
    return BlockWeight.from_bytes(qtype, torch.from_numpy(raw), n, k), torch.from_numpy(expected)


@pytest.mark.parametrize("path", ["compiled", "torch"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_type_decodes_to_what_gguf_reads(request, monkeypatch, path, qtype):
    if path == "compiled":
        request.getfixturevalue("compiled")
    else:
        monkeypatch.setattr(blocks, "_blocks", None)
    w, expected = _blocks(qtype, 5, 512 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 352)
    assert torch.equal(w.dequantize(), expected)
    rows = torch.tensor([4, 0, 4, 2])
    assert torch.equal(w.dequantize(rows), expected[rows])  # an embedding lookup decodes only its rows
    assert torch.equal(w[rows].dequantize(), expected[rows])  # rows taken in blocks (llama's rotary unpermute)


def test_bytes_that_do_not_fit_the_shape_are_refused():
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not hold"):
        BlockWeight(gguf.GGMLQuantizationType.Q8_0, raw, 64)
    with pytest.raises(ValueError, match="not kept"):
        BlockWeight(gguf.GGMLQuantizationType.Q8_1, raw, 32)


ROUNDING = {"int16": (256, 16383), "int8": (32, 127)}  # activation block, integer range


def _bound(x: torch.Tensor, deq: torch.Tensor, acts: str | None) -> torch.Tensor:
    """[M, N] float64: how far each output may be from x @ deq.T in float64 when the
    activations are rounded as ``acts`` says (None: not rounded)."""
    x64, w64 = x.double(), deq.double()
    slack = 1e-5 * (x64.abs() @ w64.abs().T) + 1e-6
    if acts is None:
        return slack
    block, levels = ROUNDING[acts]
    m, k = x.shape
    groups = -(-k // block)
    padded = torch.nn.functional.pad(x64, (0, groups * block - k))  # a row's last block may be shorter
    dx = padded.reshape(m, groups, block).abs().amax(-1) / levels  # [M, groups]
    return (dx / 2).repeat_interleave(block, dim=1)[:, :k] @ w64.abs().T + slack


# "-portable", "-avx2": that kernel unit by name (the bare path is the best this CPU runs)
PATHS = [f"{a}{u}" for a in ("int16", "int8") for u in ("", "-portable", "-avx2")]
PATHS += ["float", "float-portable", "torch"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_is_within_the_derived_bound(request, monkeypatch, path, qtype):
    ext = request.getfixturevalue("compiled") if path != "torch" or qtype not in FLOATS else None
    small = gguf.GGML_QUANT_SIZES[qtype][0] < 256  # rows of 11 and 22 blocks: chunks of 8 and a rest
    acts, _, unit = path.partition("-")
    if unit == "avx2" and ext.isa() != "avx512":
        pytest.skip("the AVX2 unit is the bare path's on this CPU (or it has none)")
    for m, n, k in [(1, 37, 352 if small else 256), (5, 300, 704 if small else 512), (33, 64, 1024)]:
        w, deq = _blocks(qtype, n, k, seed=m)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
        if unit:
            y = ext.block_linear_on(x, [w.data], [int(qtype)], blocks.ACT_MODES[acts], unit)  # [m, n]
        elif path == "torch":
            y = block_linear(x, [w], compiled=False)  # [m, n]
        else:
            y = block_linear(x, [w], compiled=True, acts=acts)  # [m, n]
        assert y.shape == (m, n) and y.dtype == torch.float32
        err = (y.double() - x.double() @ deq.double().T).abs()
        rounded = acts if acts in ROUNDING and qtype not in FLOATS else None
        bound = _bound(x, deq, rounded)
        assert bool((err <= bound).all()), f"[{m}x{k}] @ [{n}x{k}]: worst excess {(err - bound).max().item():.3g}"
        if rounded:  # the bound is not vacuous: the rounding shows, within it
            assert err.max() > 1e-4 * bound.max()


def test_the_fused_kernels_agree_with_the_decoding_ones(compiled):
    """The 16-bit path's fused kernels (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0) of every vector unit
    this CPU runs (AVX2's madd, AVX-512 VNNI's dpwssd) and the portable decode-then-dot
    kernels compute the same integer sums: equal up to float32 order (1 and 3 rows: one
    activation row at a time; 6: four at a time, then one). Same for the int8 path."""
    units = [u for u in compiled.isas() if u != "portable"]
    if not units:
        pytest.skip("no vector unit on this CPU")
    T = gguf.GGMLQuantizationType
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q4_0):
        w, _ = _blocks(qtype, 41, 1024, seed=3)
        for rows in (1, 3, 6):
            x = torch.randn(rows, 1024, generator=torch.Generator().manual_seed(4))
            for acts in ("int16", "int8"):
                mode = blocks.ACT_MODES[acts]
                portable = compiled.block_linear_on(x, [w.data], [int(qtype)], mode, "portable")
                for unit in units:
                    fused = compiled.block_linear_on(x, [w.data], [int(qtype)], mode, unit)
                    torch.testing.assert_close(
                        fused, portable, rtol=1e-5, atol=1e-4, msg=f"{unit} {acts} {qtype.name}, {rows} rows"
                    )


def test_fused_parts_of_different_types_are_one_matmul(compiled):
    kinds = [
        (gguf.GGMLQuantizationType.Q4_K, 64),
        (gguf.GGMLQuantizationType.Q6_K, 32),
        (gguf.GGMLQuantizationType.Q8_0, 32),
    ]
    parts = [_blocks(t, n, 512, seed=n) for t, n in kinds]
    layer = BlockLinear(512, [64, 32, 32], bias=True)
    for i, (w, _) in enumerate(parts):
        layer.set_part(i, w)
    layer.bias.data = torch.arange(128.0)
    x = torch.randn(2, 3, 512)
    y = layer(x)  # [2, 3, 128]
    alone = torch.cat([block_linear(x, [w]) for w, _ in parts], dim=-1) + layer.bias
    torch.testing.assert_close(y, alone, rtol=0, atol=0)
    for acts in ROUNDING:  # activations rounded once for all parts, as for each alone
        fused = block_linear(x, [w for w, _ in parts], acts=acts)
        alone = torch.cat([block_linear(x, [w], acts=acts) for w, _ in parts], -1)
        torch.testing.assert_close(fused, alone, rtol=0, atol=0)
    with pytest.raises(ValueError, match="expected"):
        layer.set_part(0, parts[1][0])


def test_the_kernel_unit_is_chosen_by_the_cpu_and_capped_by_the_environment(compiled):
    units = compiled.isas()
    assert units[0] == "portable" and compiled.isa() == units[-1]
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    assert ("avx512" in units) == {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}.issubset(flags)
    code = "from engine.kernels import _blocks; print(_blocks.isa())"
    for cap in ("portable", "bogus"):
        env = {**os.environ, "SLOTSERVE_ISA": cap}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == (cap if cap != "bogus" else units[-1])
    with pytest.raises(RuntimeError, match="unknown instruction set"):
        compiled.block_linear_on(torch.zeros(1, 32), [torch.zeros(1, 34, dtype=torch.uint8)], [8], 2, "sse9")


def test_without_the_extension_the_torch_path_runs_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(blocks, "_blocks", None)
    assert blocks.compiled_isa() is None
    with caplog.at_level(logging.INFO, logger="slotserve.kernels"):
        blocks.log_kernel_choice()
    assert [r.message for r in caplog.records if "torch-only" in r.message]
    w, deq = _blocks(gguf.GGMLQuantizationType.Q4_K, 300, 256)
    x = torch.randn(4, 256)
    torch.testing.assert_close(block_linear(x, [w]), x @ deq.T, atol=1e-4, rtol=1e-5)
    with pytest.raises(RuntimeError, match="not built"):
        block_linear(x, [w], compiled=True)


@pytest.mark.parametrize("shape", [(1, 768), (70, 256), (3, 4, 64)])
def test_the_compiled_rms_norm_is_torchs(compiled, monkeypatch, shape):
    from engine.kernels import norm
    from engine.models.layers import RMSNorm

    layer = RMSNorm(shape[-1], 1e-5)
    layer.weight.data = torch.randn(shape[-1])
    x = torch.randn(*shape) * 4
    fused = norm.fused_rms_norm(x, layer.weight, 1e-5)
    assert fused is not None and fused.shape == x.shape
    torch.testing.assert_close(fused, torch.nn.functional.rms_norm(x, shape[-1:], layer.weight, 1e-5))
    torch.testing.assert_close(layer(x), fused, rtol=0, atol=0)  # the layer takes the compiled call
    assert norm.fused_rms_norm(x.double(), layer.weight.double(), 1e-5) is None  # float32 only
    monkeypatch.setattr(norm, "_blocks", None)
    torch.testing.assert_close(layer(x), fused)  # torch's path without the extension


def test_experts_taken_from_a_mapped_stack_hand_their_pages_back_when_packed(compiled, tmp_path):
    """Each expert's rows of a stacked tensor in a private file mapping (what a MoE GGUF
    holds) are taken as a view, and packing each hands its pages back: once every expert
    is packed, the file's pages are not resident (before, the stack was handed back as
    each expert was taken and read in again by each packing: resident twice)."""
    import mmap

    experts, rows, cols = 16, 1024, 2048
    row_bytes = cols // 32 * 34  # Q8_0
    path = tmp_path / "stack.bin"
    with open(path, "wb") as f:  # scales of 1.0 (f16 0x3C00), values 1..127
        block = bytes([0x00, 0x3C]) + bytes(range(1, 33))
        f.write(block * (experts * rows * cols // 32))

    def rss_file() -> int:
        line = next(x for x in open("/proc/self/status") if x.startswith("RssFile:"))
        return int(line.split()[1]) * 1024

    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    stack = BlockWeight.from_bytes(gguf.GGMLQuantizationType.Q8_0, mapping, experts * rows, cols, mapped=True)
    before = rss_file()
    taken = [stack[e * rows : (e + 1) * rows] for e in range(experts)]
    packed = [t.pack() for t in taken]
    grown = rss_file() - before
    assert grown < 0.1 * experts * rows * row_bytes, f"{grown} bytes of the file's pages still resident"
    assert all(t.mapped and t.data.data_ptr() == stack.data[e * rows].data_ptr() for e, t in enumerate(taken))
    assert torch.equal(packed[3].dequantize(slice(0, 8)), taken[3].dequantize(slice(0, 8)))
