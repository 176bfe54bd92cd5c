"""The small per-layer ops of a decode step in one Triton kernel each, on CUDA: RMSNorm
(eager torch: ~8 kernels), rotary (4) and silu(gate) * up (2). A 16-layer decode step
goes from ~530 launches to about half; inside a CUDA graph each launch still costs the
GPU a few microseconds. Each rounds where transformers' eager code rounds (bfloat16
after normalizing, again after the weight), so greedy tokens stay transformers'.
Importing this module without Triton raises ImportError (the hooks in norm.py,
rotary.py and activation.py then return None and torch runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    normed = (x * tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)).to(y_ptr.dtype.element_ty)  # as x.to(dtype)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (w * normed.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dim of a contiguous x [..., D]."""
    n_cols = x.shape[-1]
    y = torch.empty_like(x)
    _rms_norm_kernel[(x.numel() // n_cols,)](x, weight, y, n_cols, eps, BLOCK=triton.next_power_of_2(n_cols))
    return y


@triton.jit
def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, stride_token, n_heads, D: tl.constexpr):
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, D)
    src = x_ptr + t * stride_token + h * D
    x = tl.load(src + d).to(tl.float32)
    rolled = tl.load(src + (d + D // 2) % D).to(tl.float32)  # torch.roll by D / 2
    c, s = tl.load(cos_ptr + t * D + d), tl.load(sin_ptr + t * D + d)
    tl.store(y_ptr + (t * n_heads + h) * D + d, (x * c + rolled * s).to(y_ptr.dtype.element_ty))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine/models/rope.py's ``rotate`` for x [T, N, D] whose rows may be strided (a
    slice of the fused projection) and float32 cos, sin [T, 1, D] -> contiguous [T, N, D]."""
    n_tok, n_heads, dim = x.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rotate_kernel[(n_tok, n_heads)](x, cos, sin, y, x.stride(0), n_heads, D=dim)
    return y


@triton.jit
def _silu_mul_kernel(g_ptr, y_ptr, ffn, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < ffn
    gate = tl.load(g_ptr + t * 2 * ffn + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(g_ptr + t * 2 * ffn + ffn + cols, mask=ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(y_ptr.dtype.element_ty)  # F.silu, rounded as torch does
    tl.store(y_ptr + t * ffn + cols, (act.to(tl.float32) * up).to(y_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[:, :F]) * gate_up[:, F:] for a contiguous [T, 2F] -> [T, F]."""
    n_tok, ffn = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty(n_tok, ffn, dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(n_tok, triton.cdiv(ffn, 1024))](gate_up, y, ffn, BLOCK=1024)
    return y
