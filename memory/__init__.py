"""Caches and sequence bookkeeping. Imports no model code and no HTTP code."""

from memory.block_pool import BlockPool
from memory.paged_kv import PagedKVCache
from memory.protocol import (
    CacheFull,
    ForwardView,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryError_,
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
    "MemoryError_",
    "MemoryUsage",
    "PagedKVCache",
    "SeqState",
    "StateMismatch",
]
