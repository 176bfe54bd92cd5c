"""Caches and sequence bookkeeping. Imports no model code and no HTTP code."""

from memory.block_pool import BlockPool
from memory.paged_kv import PagedKVCache
from memory.protocol import (
    CacheFull,
    ForwardView,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.spec import FullAttentionSpec, LayerSpec

__all__ = [
    "BlockPool",
    "CacheFull",
    "ForwardView",
    "FullAttentionSpec",
    "IntegrityError",
    "LayerSpec",
    "Memory",
    "MemoryBatch",
    "MemoryUsage",
    "PagedKVCache",
    "SeqState",
    "StateMismatch",
]
