"""Activations whose every element is computed the same way whatever the tensor's shape.

torch's CPU kernels for sigmoid, silu, softplus and tanh-GELU run the vectorized
function over whole vectors and a scalar one over what is left, and the two differ in
the last bit: the same row gives other bits as one row of a decode step than as a row
of a longer chunk. A speculation's verify step must give its rows exactly as the decode
steps of those positions would (8-bit activations turn a last-bit difference into a
whole step now and then), so the models use these, built from ``exp``, ``tanh`` and
IEEE arithmetic, which torch computes alike in both paths. Each is within an ulp or two
of torch's own, and is torch's own off float32 CPU tensors (half precision, CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None

_GELU_C = (2.0 / torch.pi) ** 0.5
# Batches of up to this many rows (decode and verify steps: 8 sequences x 8 rows) go
# through ``linear`` row by row.
SHORT_BATCH = 64


def _torch_s(x: torch.Tensor) -> bool:
    return x.dtype != torch.float32 or x.device.type != "cpu"


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    if _torch_s(x):
        return torch.sigmoid(x)
    return torch.exp(-x).add_(1.0).reciprocal_()


def silu(x: torch.Tensor) -> torch.Tensor:
    if _torch_s(x):
        return F.silu(x)
    return x * sigmoid(x)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), x itself above 20 (torch's threshold)."""
    if _torch_s(x):
        return F.softplus(x)
    return torch.where(x > 20.0, x, torch.exp(x.clamp(max=20.0)).log1p_())


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    if _torch_s(x):
        return F.gelu(x, approximate="tanh")
    inner = x + 0.044715 * x * x * x
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * inner))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with a float weight, each row's outputs the same bits whatever the
    batch for a short one (``SHORT_BATCH`` rows, one row included), where BLAS's
    matrix-matrix kernel would sum in another order than a one-row step's matrix-vector
    one: the compiled fixed-order product (engine/kernels/csrc/float_impl.inc; 8x
    faster than row by row for 8 rows of a 16 x 1024 router), else row by row. For the
    small float matrices beside the packed projections (routers, gates); x [T, in] ->
    [T, out]. A longer batch (a prompt's chunk beside a verify step) takes BLAS's one
    matrix product, and its verify rows may differ in the last bits."""
    if x.shape[0] <= SHORT_BATCH and not _torch_s(x) and x.dim() == 2 and weight.dtype == torch.float32:
        if _blocks is not None:
            return _blocks.float_linear(x, weight, bias)
        if x.shape[0] > 1:
            return torch.cat([F.linear(x[i : i + 1], weight, bias) for i in range(x.shape[0])])
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """An ``nn.Linear`` computed through ``linear``: a router or gate, whose rows must not
    depend on the batch. Loaded as any linear layer (kept in blocks where the file
    quantizes it, and a packed block kernel is row-invariant); left as it is by
    ``pack_linears``, whose oneDNN kernels are chosen per row count."""

    row_invariant = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
