"""oneDNN-prepacked linear layers for CPU decode shapes.

Plain ``F.linear`` reaches about half the memory bus for the 1-32 row matmuls of a
decode step on CPU; oneDNN's prepacked weight layout (what ``torch.compile`` with
freezing uses on CPU) is markedly faster there (figures in docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import nn


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """Inference-only replacement of an ``nn.Linear`` (float32 on CPU)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 8):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().contiguous()
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint), persistent=False)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module, batch_hint: int = 8) -> int:
    """Replace every ``nn.Linear`` of ``model`` in place; returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, batch_hint))
    return len(targets)
