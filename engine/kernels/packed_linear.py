"""oneDNN-prepacked linear layers for CPU decode shapes.

Plain ``F.linear`` reaches about half the memory bus for the 1-32 row matmuls of a
decode step on CPU; oneDNN's prepacked weight layout (what ``torch.compile`` with
freezing uses on CPU) is markedly faster there (figures in docs/benchmarks.md).

oneDNN keeps, for every input shape it has seen, a primitive plus an output-sized
buffer (measured: about rows x out_features x 4 bytes per shape, kept for the life of
the process). A server sees every row count from 1 to the batch size, so left alone
those buffers grow with the variety of steps (a 30-minute soak: +105 MB). Row counts
are therefore bucketed: up to ``EXACT_ROWS`` rows go as they are (decode, where
padding would cost the most), more rows are cut into pieces of at most ``CHUNK_ROWS``,
each zero-padded to a multiple of ``EXACT_ROWS``. That bounds the shapes per weight at
``EXACT_ROWS + CHUNK_ROWS // EXACT_ROWS - 1`` whatever the prefill size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EXACT_ROWS = 32
CHUNK_ROWS = 256


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
        if x.dim() == 2 and x.shape[0] <= EXACT_ROWS and x.is_contiguous():  # decode: no reshapes
            return onednn_linear(x, self.packed, self.bias)  # [M, out]
        rows = x.reshape(-1, self.in_features)  # [M, in]
        m = rows.shape[0]
        if m <= EXACT_ROWS:
            out = onednn_linear(rows.contiguous(), self.packed, self.bias)  # [M, out]
        else:
            pieces = []
            for start in range(0, m, CHUNK_ROWS):
                piece = rows[start : start + CHUNK_ROWS]  # [r, in]
                r = piece.shape[0]
                pad = -r % EXACT_ROWS
                if pad:
                    piece = F.pad(piece, (0, 0, 0, pad))  # [r + pad, in]
                pieces.append(onednn_linear(piece.contiguous(), self.packed, self.bias)[:r])  # [r, out]
            out = torch.cat(pieces)  # [M, out]
        return out.reshape(*x.shape[:-1], self.out_features)


def onednn_linear(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[M, in] x prepacked [out, in] -> [M, out]; every distinct M is a cached oneDNN shape."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


def pack_linears(model: nn.Module, batch_hint: int = 8) -> int:
    """Replace every ``nn.Linear`` of ``model`` in place; returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and not getattr(child, "row_invariant", False)  # routers stay as they are
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, batch_hint))
    return len(targets)
