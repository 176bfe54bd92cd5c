"""Frozen per-layer memory specs: what one layer needs stored per token.

A model declares one spec per layer (a list indexed by layer); memory is built from
that list by ``memory.registry``, never from the architecture name. Each spec knows
its own byte size per token, so sizing sums specs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FullAttentionSpec:
    """A layer that attends to every earlier position of its sequence."""

    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    kind = "attention_full"

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_kv_heads * self.head_dim * itemsize  # K and V


LayerSpec = FullAttentionSpec  # later: SlidingWindowSpec | RecurrentSpec | ReuseSpec
