"""Caches and sequence bookkeeping. Imports no model code and no HTTP code."""

from memory.attention.block_pool import BlockPool
from memory.attention.kv_view import set_decode_kernel, set_store_kernel, set_stream_decode_kernel
from memory.attention.paged_kv import PagedKVCache
from memory.protocol import (
    CacheFull,
    ForwardView,
    GroupUsage,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryError_,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.recurrent.recurrent_memory import RecurrentMemory
from memory.registry import MemoryConfig, build_memory, cache_bytes
from memory.spec import FullAttentionSpec, LayerSpec, NoCacheSpec, RecurrentSpec, ReuseSpec, SlidingWindowSpec

__all__ = [
    "BlockPool",
    "CacheFull",
    "ForwardView",
    "FullAttentionSpec",
    "GroupUsage",
    "IntegrityError",
    "LayerSpec",
    "Memory",
    "MemoryBatch",
    "MemoryConfig",
    "MemoryError_",
    "MemoryUsage",
    "NoCacheSpec",
    "ReuseSpec",
    "PagedKVCache",
    "RecurrentMemory",
    "RecurrentSpec",
    "SeqState",
    "SlidingWindowSpec",
    "StateMismatch",
    "set_decode_kernel",
    "set_store_kernel",
    "set_stream_decode_kernel",
    "build_memory",
    "cache_bytes",
]
