"""The gated MLP's activation, silu(gate) * up, in one compiled call
(engine/kernels/csrc/mlp_impl.inc) where the extension is built: eager torch runs it as
split, silu and mul, ~20 us per decode-step layer on the 2-core AVX2 EPYC."""

from __future__ import annotations

import torch

from engine.kernels import cuda_ops

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None


def fused_silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate_up[:, :F]) * gate_up[:, F:] for a float32 CPU [T, 2F], or None where
    the compiled kernel cannot take it (the caller runs torch's); a contiguous CUDA one
    goes to Triton."""
    if cuda_ops.usable(gate_up):
        return cuda_ops.ops.silu_mul(gate_up) if gate_up.dim() == 2 and gate_up.is_contiguous() else None
    if _blocks is None or gate_up.dim() != 2 or gate_up.dtype != torch.float32 or gate_up.device.type != "cpu":
        return None
    return _blocks.silu_mul(gate_up)
