"""Weights kept in GGUF's block types (issue 25): ``BlockWeight`` holds a tensor's bytes
as the file stores them, ``BlockLinear`` and ``BlockEmbedding`` compute with them.

The types kept: F16 and BF16 (16-bit floats), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
MXFP4 (blocks of 32 values; MXFP4 decodes as IQ4_NL does, through its e2m1 grid and an
e8m0 scale) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (super-blocks of 256).
A weight of N rows of K values is ``data`` [N, K / values per block * bytes per block]
uint8: row-major blocks, byte for byte the file's, so rows can be permuted and selected
without decoding anything.

Matmuls run the compiled kernels (engine/kernels/csrc; AVX2 where the CPU has it) below
``compiled_rows(parts)`` activation rows. How they round the activations (``acts``):

- ``"int8"``, the default (issue 36): llama.cpp's 8-bit blocks of 32 with a float scale
  each, so the accuracy is within what llama.cpp's users accept (tests/test_quantized_models.py
  bounds it by llama.cpp's own rounding; its K-quants round per 256, coarser). Packed
  weights (``PACKED``) always take 8-bit activations in their own kernel; for the file's
  other types (Q2_K, Q3_K, Q4_1, Q5_0, Q5_1, IQ4_NL) this mode measured 1.1-1.8x faster
  than ``"int16"`` (2-core Sapphire Rapids-class Xeon, 1 to 32 rows).
- ``"int16"``: each 256 values of an activation row become integers within +-16383 and
  one scale (a value moves by at most max|x| / 32766 of its group); one 16-bit
  multiply-add per 16 values. The issue-25 default, more exact than llama.cpp's; kept for
  measurements and as the exactness reference of the kernel tests.
- ``"float"``: float32 products, no rounding beyond the weights' (and float32 sums).

docs/architecture.md, "Weights in GGUF blocks", has the figures and the choice.
Above, and where the extension is not built, the weight is decoded ``TILE`` rows at a
time into one reused float32 buffer and multiplied by oneDNN's GEMM: never a float32
copy of the whole weight.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
from dataclasses import dataclass

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

T = gguf.GGMLQuantizationType
KEPT = frozenset(
    {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS}
    | {T.MXFP4}
)
TILE = 256  # weight rows decoded at a time off the compiled path
# 2-core AMD EPYC, AVX2, 16-bit activations against decoded tiles through oneDNN's float32
# GEMM: the compiled kernel 1.1-1.6x faster at 32 rows, the tiles 1.2-1.5x faster for the
# K-quants at 64 (Q8_0 even); at batch 32 the 88M Q4_K_M decode step takes 111 ms compiled,
# 193 ms tiled. Decode batches stay compiled, prefill chunks go to the GEMM. With AVX-512
# VNNI (2-core Zen 4 EPYC) the compiled kernel is 1.2-2.9x faster at 64 rows, 0.9-1.9x at
# 128 (Q4_K, Q8_0, Q6_K, 2048x8192 and 8192x2048), the tiles 1.2-1.5x faster at 512: 96.
COMPILED_MAX_ROWS = 48
COMPILED_MAX_ROWS_VNNI = 96
# Packed weights (PACKED): the integer kernel at every row count with VNNI's dpbusd (2-core
# Sapphire Rapids, 2048x8192 and 8192x2048: 1.4-4.6x the 16-bit kernel or the tiles up to 32
# rows, 1.0-2.3x at 128, 0.7-1.1x at 512 against oneDNN's float32 GEMM, which runs 512-bit
# FMAs there); on AVX2 alone (maddubs + madd, measured as the avx2 unit on that machine)
# 1.0-2.7x up to 32 rows, 0.6-1.0x at 128: the tiles from 64.
PACKED_MAX_ROWS_VNNI = 1 << 62
PACKED_MAX_ROWS = 64
# F16/BF16 weights are converted row by row and dotted in float32 with each activation
# row: 2x faster than the tiles at 1 row, even at 2, slower from 8 (at 32: 3-4x slower).
FLOAT_MAX_ROWS = 8


def compiled_rows(parts: list[BlockWeight]) -> int:
    """Activation rows from which the tiles beat the compiled kernel for these parts."""
    if parts and all(p.packed for p in parts):
        return PACKED_MAX_ROWS_VNNI if compiled_isa() == "avx512" else PACKED_MAX_ROWS
    if any(p.qtype in (T.F16, T.BF16) for p in parts):
        return FLOAT_MAX_ROWS
    return COMPILED_MAX_ROWS_VNNI if compiled_isa() == "avx512" else COMPILED_MAX_ROWS


# Types whose rows are repacked at load into 8-row groups (csrc/packed_impl.inc): their
# matmuls take 8-bit activations and run one integer kernel for every row count.
PACKED = frozenset({T.Q4_0, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.MXFP4})

ACT_MODES = {"float": 0, "int8": 1, "int16": 2}  # how the compiled kernels round activations
ACTIVATIONS = "int8"  # the default (see above)

log = logging.getLogger("slotserve.kernels")

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None


def compiled_isa() -> str | None:
    """The compiled kernels' unit on this CPU ("avx512": AVX-512 VNNI, "avx2",
    "portable"; the environment's ``SLOTSERVE_ISA`` may name a lesser one), or None when
    the extension is not built."""
    return _blocks.isa() if _blocks is not None else None


def log_kernel_choice(packed: tuple[int, int] = (0, 0)) -> None:
    """One log line: which block matmuls this process runs (``packed``: the layers and
    bytes ``pack_block_linears`` repacked)."""
    isa = compiled_isa()
    if isa is None:
        log.warning("quantized matmuls: compiled kernels not built (no C++ compiler at install?); torch-only path")
    else:
        layers, size = packed
        log.info("quantized matmuls: compiled kernels, %s; %d layers repacked (%.1f MB)", isa, layers, size / 1e6)


@dataclass(frozen=True)
class BlockWeight:
    """A 2-D weight [rows, cols] in a GGUF block type: the file's bytes, or (``packed``)
    the same values repacked into 8-row groups for the integer kernel (``pack``).
    ``mapped``: ``data`` is a view of a private mapping of the model file."""

    qtype: gguf.GGMLQuantizationType
    data: torch.Tensor  # [rows, row_bytes] uint8; packed: [rows / 8, group_bytes]
    cols: int
    packed: bool = False
    mapped: bool = False

    def __post_init__(self):
        values, size = gguf.GGML_QUANT_SIZES[self.qtype]
        if self.qtype not in KEPT:
            raise ValueError(f"type {self.qtype.name} is not kept in blocks")
        width = _blocks.packed_bytes(int(self.qtype), self.cols) if self.packed else self.cols // values * size
        if self.cols % values or self.data.dim() != 2 or self.data.shape[1] != width:
            raise ValueError(f"{tuple(self.data.shape)} bytes do not hold rows of {self.cols} {self.qtype.name} values")

    @classmethod
    def from_bytes(
        cls, qtype: gguf.GGMLQuantizationType, raw, rows: int, cols: int, mapped: bool = False
    ) -> BlockWeight:
        """``raw`` (bytes, bytearray, a uint8 array) of a [rows, cols] tensor, shared, not copied."""
        data = torch.frombuffer(raw, dtype=torch.uint8) if not isinstance(raw, torch.Tensor) else raw
        return cls(qtype, data.reshape(rows, -1), cols, mapped=mapped)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0] * (8 if self.packed else 1), self.cols)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def packable(self) -> bool:
        """Whether ``pack`` has a layout for this weight here (the compiled kernels built,
        a type of ``PACKED``, rows a multiple of 8)."""
        return (
            _blocks is not None
            and not self.packed
            and self.qtype in PACKED
            and self.shape[0] % 8 == 0
            and _blocks.packed_bytes(int(self.qtype), self.cols) > 0
        )

    def pack(self) -> BlockWeight:
        """The same values in 8-row groups (``packable`` must hold). A mapped source's
        pages are handed back to the page cache: the packed copy is what stays resident."""
        packed = _blocks.block_pack(self.data.contiguous(), int(self.qtype), self.cols)  # [rows / 8, group_bytes]
        if self.mapped:
            release_pages(self.data)
        return BlockWeight(self.qtype, packed, self.cols, packed=True)

    def __getitem__(self, rows: torch.Tensor | slice) -> BlockWeight:
        """Some rows, still in blocks (not of a packed weight). A run of rows (a slice: an
        expert's rows of a stacked tensor) is a view, mapped as its source is, so that
        packing it hands its own pages back; other rows (an index tensor) are a copy, and
        a mapped source's pages are handed back (``release_pages``; read again from the
        file if ever needed). Before, a run was handed back whole when each expert was
        taken and then read in again by each expert's packing: a MoE file's experts
        stayed resident twice, as file pages and packed (+630 MB for the issue-52 MoE)."""
        if self.packed:
            raise ValueError("rows of a packed weight are not taken one by one")
        if isinstance(rows, slice) and rows.step in (None, 1):
            return BlockWeight(self.qtype, self.data[rows], self.cols, mapped=self.mapped)
        taken = BlockWeight(self.qtype, self.data[rows].contiguous(), self.cols)
        if self.mapped:
            release_pages(self.data)
        return taken

    def dequantize(self, rows: torch.Tensor | slice | None = None, into: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 values of all rows, or of ``rows`` -> [n, cols] (written into
        ``into``, a contiguous [n, cols] float32 tensor, when given)."""
        if self.packed:
            return self._dequantize_packed(rows, into)
        data = self.data if rows is None else self.data[rows]  # [n, row_bytes]
        if _blocks is not None:
            return _blocks.block_dequant(data.contiguous(), int(self.qtype), self.cols, into)
        values = gguf.quants.dequantize(data.numpy(), self.qtype)  # [n, cols]
        out = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(-1, self.cols)
        return out if into is None else into.copy_(out)

    def _dequantize_packed(self, rows: torch.Tensor | slice | None, into: torch.Tensor | None) -> torch.Tensor:
        """A packed weight's rows: whole groups decoded (a slice from a multiple of 8, as
        the tiles take them), then the rows asked for."""
        n = self.shape[0]
        if isinstance(rows, slice) and rows.step in (None, 1) and (rows.start or 0) % 8 == 0:
            start, stop, _ = rows.indices(n)
            groups = self.data[start // 8 : (stop + 7) // 8]  # [g, group_bytes]
            out = _blocks.packed_dequant(groups, int(self.qtype), self.cols)[: stop - start]  # [n, cols]
        else:
            out = _blocks.packed_dequant(self.data, int(self.qtype), self.cols)  # [rows, cols]
            out = out if rows is None else out[rows]
        return out if into is None else into.copy_(out)


def release_pages(view: torch.Tensor) -> None:
    """Drop the whole pages under ``view`` from the process (madvise MADV_DONTNEED): for a
    view of a private, never-written file mapping, a later read faults the file's bytes
    in again, so nothing is lost; only what the process holds resident shrinks."""
    start = view.data_ptr()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + view.numel()) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # 4: MADV_DONTNEED


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def block_linear(
    x: torch.Tensor, parts: list[BlockWeight], compiled: bool | None = None, acts: str | None = None
) -> torch.Tensor:
    """x [..., K] @ W.T for W the parts stacked by rows -> [..., sum of their rows], in
    x's dtype. ``compiled`` forces the compiled kernel (True) or decoded tiles (False);
    by default the compiled kernel below ``compiled_rows(parts)`` rows, where it is built.
    ``acts``: how the compiled kernel rounds the activations (a key of ``ACT_MODES``;
    default ``ACTIVATIONS``)."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).float()  # [M, K]
    if compiled is None:
        compiled = _blocks is not None and rows.shape[0] < compiled_rows(parts)
    if compiled and any(p.packed for p in parts):  # the integer kernel, int8 activations whatever ``acts``
        if all(p.packed for p in parts):
            y = _blocks.packed_linear(rows, [p.data for p in parts], [int(p.qtype) for p in parts])  # [M, N]
        else:
            y = torch.cat([block_linear(rows, [p], True, acts) for p in parts], dim=-1)  # [M, N]
    elif compiled:
        if _blocks is None:
            raise RuntimeError("the compiled kernels are not built")
        mode = ACT_MODES[acts or ACTIVATIONS]
        y = _blocks.block_linear(rows, [p.data for p in parts], [int(p.qtype) for p in parts], mode)  # [M, N]
    else:
        y = torch.cat([_tiled(rows, p) for p in parts], dim=-1) if len(parts) > 1 else _tiled(rows, parts[0])
    return y.reshape(*lead, y.shape[-1]).to(x.dtype)


def _tiled(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """x [M, K] @ w.T through float32 tiles of ``TILE`` weight rows, decoded into one
    buffer reused tile after tile -> [M, N]."""
    n = w.shape[0]
    y = torch.empty(x.shape[0], n, dtype=torch.float32)  # [M, N]
    tile = torch.empty(min(TILE, n), w.cols, dtype=torch.float32)  # [TILE, K]
    for r in range(0, n, TILE):
        rows = tile[: min(TILE, n - r)]
        y[:, r : r + TILE] = F.linear(x, w.dequantize(slice(r, r + TILE), into=rows))
    return y


class BlockLinear(nn.Module):
    """A linear layer on weights in blocks: one part, or several side by side (fused
    q/k/v or gate/up, whose parts may have different types). Built empty, with the rows
    of each part; ``set_part`` fills them (the loader), so no float weight ever exists."""

    def __init__(self, in_features: int, part_rows: list[int], bias: bool = False):
        super().__init__()
        self.in_features, self.part_rows = in_features, list(part_rows)
        self.out_features = sum(part_rows)
        self.parts: list[BlockWeight | None] = [None] * len(part_rows)
        self._args: tuple[list[torch.Tensor], list[int]] | None = None  # set once every part is in
        self._max_rows = 0  # below it, the compiled kernel (compiled_rows)
        self.bias = nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None

    def set_part(self, i: int, weight: BlockWeight) -> None:
        """ValueError when the part's shape is not [part_rows[i], in_features]."""
        if weight.shape != (self.part_rows[i], self.in_features):
            raise ValueError(f"shape {weight.shape}, expected {(self.part_rows[i], self.in_features)}")
        self.parts[i] = weight
        if not self.missing:  # what the compiled call takes, built once (a decode step makes ~50 calls)
            self._args = ([p.data for p in self.parts], [int(p.qtype) for p in self.parts])
            self._max_rows = compiled_rows(self.parts)

    @property
    def missing(self) -> list[int]:
        return [i for i, p in enumerate(self.parts) if p is None]

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts if p is not None)

    @property
    def packable(self) -> bool:
        return not self.missing and all(p.packable for p in self.parts)

    def pack(self) -> int:
        """Repack every part into 8-row groups (``BlockWeight.pack``) when all of them have
        the layout; returns the bytes packed (0: left as the file's)."""
        if not self.packable:
            return 0
        for i, part in enumerate(self.parts):
            self.set_part(i, part.pack())
        return self.weight_bytes

    @property
    def packed(self) -> bool:
        return bool(self.parts) and all(p is not None and p.packed for p in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _blocks is not None and x.dim() == 2 and x.dtype == torch.float32 and x.shape[0] < self._max_rows:
            if self.packed:
                y = _blocks.packed_linear(x, *self._args)  # every row count: the integer kernel
            else:
                y = _blocks.block_linear(x, *self._args, ACT_MODES[ACTIVATIONS])  # decode: straight to the kernel
        else:
            y = block_linear(x, self.parts)  # [..., out]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kinds = "+".join(p.qtype.name if p is not None else "?" for p in self.parts)
        return f"in_features={self.in_features}, out_features={self.out_features}, {kinds}"


class BlockEmbedding(nn.Module):
    """An embedding table in blocks: a lookup decodes only the rows asked for."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.table: BlockWeight | None = None

    def set_part(self, i: int, weight: BlockWeight) -> None:
        if i != 0 or weight.shape != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"shape {weight.shape}, expected {(self.num_embeddings, self.embedding_dim)}")
        self.table = weight

    @property
    def missing(self) -> list[int]:
        return [0] if self.table is None else []

    @property
    def weight_bytes(self) -> int:
        return self.table.nbytes if self.table is not None else 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)  # [T]
        return self.table.dequantize(flat).reshape(*ids.shape, self.embedding_dim)  # [..., dim]

    def extra_repr(self) -> str:
        kind = self.table.qtype.name if self.table is not None else "?"
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind}"
