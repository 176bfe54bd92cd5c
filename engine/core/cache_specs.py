"""The attention caches a model's layers get: their kinds after the context is known, and
the types they store (llama-server's -ctk/-ctv, or the default)."""

from __future__ import annotations

import dataclasses

import torch

from memory import FullAttentionSpec, LayerSpec, SlidingWindowSpec


def default_cache_type(in_blocks: bool, dtype: torch.dtype) -> str | None:
    """What attention caches store when -ctk/-ctv say nothing: float16 for a float32
    model whose weights are in blocks (llama-server's default, half the bytes, read as
    stored by the decode kernel); otherwise the model's dtype (None), so a float
    checkpoint stays exact against transformers."""
    return "f16" if in_blocks and dtype == torch.float32 else None


def cache_specs(specs: list[LayerSpec], n_ctx_seq: int, cache_k: str | None, cache_v: str | None) -> list[LayerSpec]:
    """A window no smaller than what a sequence can hold never hides a key: such layers
    are stored (and attended) as full attention. Attention caches store ``cache_k`` /
    ``cache_v`` (names of memory/kv_codec.py); ValueError for a head size a type cannot hold."""
    out = []
    for s in specs:
        if getattr(s, "window", 0) >= n_ctx_seq:
            s = FullAttentionSpec(s.n_kv_heads, s.head_dim, s.dtype)
        if isinstance(s, FullAttentionSpec | SlidingWindowSpec):
            s = dataclasses.replace(s, cache_k=cache_k, cache_v=cache_v)
            s.k_codec.check(s.head_dim)
            s.v_codec.check(s.head_dim)
        out.append(s)
    return out
