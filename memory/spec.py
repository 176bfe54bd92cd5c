"""Frozen per-layer memory specs: what one layer needs stored per token.

A model declares one spec per layer (a list indexed by layer); memory is built from
that list by ``memory.registry``, never from the architecture name. Each spec knows
its own byte size per token, so sizing sums specs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
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


@dataclass(frozen=True)
class SlidingWindowSpec:
    """A layer whose query at position p attends to positions (p - window, p]."""

    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    window: int

    kind = "attention_sliding"

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_kv_heads * self.head_dim * itemsize


@dataclass(frozen=True)
class ReuseSpec:
    """A layer that stores nothing and attends to layer ``target``'s keys and values
    (Gemma 3n's KV sharing); ``target`` is an earlier layer that owns a cache."""

    target: int

    kind = "reuse"
    bytes_per_token = 0


@dataclass(frozen=True)
class NoCacheSpec:
    """A layer with no attention cache (llama.cpp's layer filter: e.g. an MLP-only layer)."""

    kind = "none"
    bytes_per_token = 0


@dataclass(frozen=True)
class RecurrentSpec:
    """A layer whose memory is a fixed-size state per sequence, whatever its length
    (Mamba: the last ``kernel - 1`` inputs of its causal convolution, and the SSM state).
    Nothing is stored per token: a recurrent state cannot forget a suffix, only be put
    back to a snapshot (see memory/recurrent.py)."""

    conv_shape: tuple[int, ...]  # e.g. (conv_channels, kernel - 1)
    ssm_shape: tuple[int, ...]  # e.g. (n_heads, head_dim, state_size)
    dtype: torch.dtype

    kind = "recurrent"
    bytes_per_token = 0

    @property
    def bytes_per_seq(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return (math.prod(self.conv_shape) + math.prod(self.ssm_shape)) * itemsize


LayerSpec = FullAttentionSpec | SlidingWindowSpec | ReuseSpec | NoCacheSpec | RecurrentSpec
NO_STORAGE = ("reuse", "none")


def bytes_per_cell(specs: Iterable[LayerSpec]) -> int:
    """Bytes one cell (one token's entry) takes across the layers of ``specs``."""
    return sum(s.bytes_per_token for s in specs)


def window_of(spec: LayerSpec) -> int | None:
    return getattr(spec, "window", None)
