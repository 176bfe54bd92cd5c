"""Rotary embedding in one compiled call (engine/kernels/csrc/rope_impl.inc), where the
extension is built: eager torch runs rotate-half as three ops (mul, roll, addcmul),
~28 us per decode-step call against ~3 us compiled (2-core AVX2 EPYC)."""

from __future__ import annotations

import torch

from engine.kernels import cuda_ops

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None


def fused_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x * cos + roll(x, D/2) * sin for float32 CPU x [T, N, D] with cos, sin [T, 1, D],
    or None where the compiled kernel cannot take them (the caller runs torch's); on
    CUDA, rows of x may be strided (Triton)."""
    if cuda_ops.usable(x):
        return _cuda_rotate(x, cos, sin)
    if _blocks is None or x.dim() != 3 or x.device.type != "cpu":
        return None
    if not (x.dtype == cos.dtype == sin.dtype == torch.float32):
        return None
    n_tok, _, dim = x.shape
    if cos.shape != (n_tok, 1, dim) or sin.shape != (n_tok, 1, dim):
        return None
    return _blocks.rope(x, cos, sin)


def _cuda_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    if x.dim() != 3 or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return None
    n_tok, n_heads, dim = x.shape
    if dim & (dim - 1) or x.stride(2) != 1 or x.stride(1) != dim:  # a power of two; rows of contiguous heads
        return None
    shape = (n_tok, 1, dim)
    if cos.shape != shape or sin.shape != shape or not (cos.is_contiguous() and sin.is_contiguous()):
        return None
    return cuda_ops.ops.rotate(x, cos, sin)
