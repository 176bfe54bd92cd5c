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

from memory.kv_codec import KVCodec, codec


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class _Stored:
    """What attention layers store per token: keys as ``cache_k`` says and values as
    ``cache_v`` (llama-server's ``-ctk``/``-ctv`` names, memory/kv_codec.py; None: plain
    values in ``dtype``)."""

    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    cache_k: str | None
    cache_v: str | None

    @property
    def k_codec(self) -> KVCodec:
        return codec(self.cache_k, self.dtype)

    @property
    def v_codec(self) -> KVCodec:
        return codec(self.cache_v, self.dtype)

    def codec_of(self, kv: str) -> KVCodec:
        """The keys' (``kv`` "k") or the values' ("v") codec."""
        return self.k_codec if kv == "k" else self.v_codec

    def stored_shape(self, kv: str, *lead: int) -> tuple[int, ...]:
        """Shape of a K or V cache tensor: ``lead`` dims, then stored rows."""
        return (*lead, self.codec_of(kv).width(self.head_dim))

    @property
    def bytes_per_token(self) -> int:
        per_row = self.k_codec.bytes_per_row(self.head_dim) + self.v_codec.bytes_per_row(self.head_dim)
        return self.n_kv_heads * per_row  # K and V


@dataclass(frozen=True)
class FullAttentionSpec(_Stored):
    """A layer that attends to every earlier position of its sequence."""

    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    cache_k: str | None = None
    cache_v: str | None = None

    kind = "attention_full"


@dataclass(frozen=True)
class SlidingWindowSpec(_Stored):
    """A layer whose query at position p attends to positions (p - window, p]."""

    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    window: int
    cache_k: str | None = None
    cache_v: str | None = None

    kind = "attention_sliding"


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
    back to a snapshot (see memory/recurrent/recurrent_memory.py)."""

    conv_shape: tuple[int, ...]  # e.g. (conv_channels, kernel - 1)
    ssm_shape: tuple[int, ...]  # e.g. (n_heads, head_dim, state_size)
    dtype: torch.dtype

    kind = "recurrent"
    bytes_per_token = 0

    @property
    def bytes_per_seq(self) -> int:
        return (math.prod(self.conv_shape) + math.prod(self.ssm_shape)) * itemsize(self.dtype)


LayerSpec = FullAttentionSpec | SlidingWindowSpec | ReuseSpec | NoCacheSpec | RecurrentSpec
NO_STORAGE = ("reuse", "none")


def bytes_per_cell(specs: Iterable[LayerSpec]) -> int:
    """Bytes one cell (one token's entry) takes across the layers of ``specs``."""
    return sum(s.bytes_per_token for s in specs)


def window_of(spec: LayerSpec) -> int | None:
    return getattr(spec, "window", None)
