"""Linear layers on weights kept quantized, as GGUF stores them (issue 25, first type:
Q8_0). A Q8_0 row of K values is K/32 blocks of 34 bytes: a float16 scale ``d``, then
32 int8 values ``q``; the value is ``d * q``.

``Q8Linear`` holds the values as int8 [N, K] and the scales as float32 [N, K/32]
(36 bytes per block: 1.06x the file's 34). Its matmul runs the compiled kernel
(engine/kernels/csrc/quant.cpp: activations quantized once per call to Q8_0 blocks,
an integer dot product per block pair, AVX2 where the CPU has it) or, where the
extension is not built, a torch-only path that dequantizes ``TILE`` output rows at a
time and multiplies in float32 (never a float32 copy of the whole weight).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

QK = 32  # values per Q8_0 block
BLOCK_BYTES = 2 + QK  # float16 scale + 32 int8
TILE = 256  # output rows dequantized at a time on the torch-only path
# From bench/quant_bench.py (2-core AMD EPYC, AVX2): the compiled kernel wins below ~128
# activation rows (decode: 4-8x F.linear at 1-8 rows); above, dequantized tiles through
# oneDNN's float32 GEMM win (prefill chunks), so those take the tiled path.
COMPILED_MAX_ROWS = 128

log = logging.getLogger("slotserve.kernels")

try:
    from engine.kernels import _quant
except ImportError:  # built by `pip install -e .` where a compiler exists
    _quant = None


def compiled_isa() -> str | None:
    """The compiled kernel's instruction set on this CPU ("avx2", "portable"), or None
    when the extension is not built."""
    return _quant.isa() if _quant is not None else None


def log_kernel_choice() -> None:
    """One log line: which quantized matmul this process runs."""
    isa = compiled_isa()
    if isa is None:
        log.warning("quantized matmuls: compiled kernels not built (no C++ compiler at install?); torch-only path")
    else:
        log.info("quantized matmuls: compiled kernel, %s", isa)


def q8_0_from_blocks(raw: np.ndarray | bytes, n_rows: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q8_0 bytes of an [n_rows, n_cols] tensor -> (qs [N, K] int8, d [N, K/32] float32).
    ValueError when the byte count does not fit the shape."""
    if n_cols % QK:
        raise ValueError(f"a Q8_0 row holds a multiple of {QK} values, got {n_cols}")
    nb = n_cols // QK
    blocks = np.frombuffer(raw, dtype=np.uint8)
    if blocks.size != n_rows * nb * BLOCK_BYTES:
        raise ValueError(f"{blocks.size} bytes do not hold a Q8_0 tensor of [{n_rows}, {n_cols}]")
    blocks = blocks.reshape(n_rows, nb, BLOCK_BYTES)
    d = blocks[:, :, :2].copy().view(np.float16).reshape(n_rows, nb).astype(np.float32)  # [N, K/32]
    qs = blocks[:, :, 2:].copy().view(np.int8).reshape(n_rows, n_cols)  # [N, K]
    return torch.from_numpy(qs), torch.from_numpy(d)


def q8_0_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] in Q8_0 (as llama.cpp quantizes: d = max|w| / 127 per block,
    stored as float16; q = w / d rounded half away from zero, with d before its rounding to
    float16) -> (qs [N, K] int8, d [N, K/32] float32): the bytes ``gguf`` and llama.cpp write."""
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // QK, QK)  # [N, K/32, 32]
    d = blocks.abs().amax(-1) / 127  # [N, K/32]
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    scaled = blocks * inv[..., None]
    qs = (scaled.sign() * (scaled.abs() + 0.5).floor()).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return qs, d.half().float()


def q8_0_dequantize(qs: torch.Tensor, d: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(qs [N, K], d [N, K/32]) -> the weight [N, K] it stands for."""
    n, k = qs.shape
    return (qs.reshape(n, k // QK, QK).to(dtype) * d[..., None].to(dtype)).reshape(n, k)


def q8_0_linear(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, compiled: bool | None = None) -> torch.Tensor:
    """x [..., K] float32 @ W.T for W = (qs [N, K], d [N, K/32]) -> [..., N].
    ``compiled``: force the compiled kernel (True) or the tiled torch path (False);
    default: the compiled kernel for fewer than ``COMPILED_MAX_ROWS`` rows, where built."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    use_compiled = _quant is not None and x2.shape[0] < COMPILED_MAX_ROWS if compiled is None else compiled
    if use_compiled:
        if _quant is None:
            raise RuntimeError("the compiled kernels are not built")
        y = _quant.q8_0_linear(x2.float(), qs, d)  # [M, N]
    else:
        n, k = qs.shape
        xf = x2.float()
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)  # [M, N]
        tile = torch.empty(min(TILE, n), k // QK, QK)  # one buffer for every tile (in place: ~10x faster)
        for r in range(0, n, TILE):
            rows = min(TILE, n - r)
            w = tile[:rows].copy_(qs[r : r + rows].reshape(rows, k // QK, QK)).mul_(d[r : r + rows, :, None])
            y[:, r : r + rows] = F.linear(xf, w.reshape(rows, k))
    return y.reshape(*lead, qs.shape[0]).to(x.dtype)


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` whose input width is a whole
    number of blocks by a ``Q8Linear`` (not the output head, as vLLM); returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and child.in_features % QK == 0 and name not in skip
    ]
    for parent, name, child in targets:
        setattr(parent, name, Q8Linear.from_linear(child))
    return len(targets)


class Q8Linear(nn.Module):
    """A linear layer whose weight stays in Q8_0 blocks (``qs``, ``d`` buffers)."""

    def __init__(self, qs: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = qs.shape
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("d", d.float().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Q8Linear:
        """``linear``'s weight quantized to Q8_0 (vLLM's ``--quantization`` at load)."""
        return cls(*q8_0_quantize(linear.weight), linear.bias)

    @property
    def weight_bytes(self) -> int:
        return self.qs.numel() * self.qs.element_size() + self.d.numel() * self.d.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = q8_0_linear(x, self.qs, self.d)  # [..., N]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, q8_0"
