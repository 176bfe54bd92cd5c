"""The host-RAM prompt cache on its own: what it keeps, what it drops, what it finds."""

from __future__ import annotations

import pytest
import torch

from engine.scheduling.prompt_cache import MIB, PromptCache, shared_prefix, state_bytes
from memory import SeqState


def state(n: int, width: int = 256) -> SeqState:
    """A state of ``n`` positions, 4 * width * n bytes of tensor plus 8 * n of positions."""
    return SeqState(torch.arange(n), {"k.0": torch.zeros(n, width)})


def test_shared_prefix_is_the_common_prefix():
    assert shared_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
    assert shared_prefix([5] * 1000 + [1], [5] * 1000 + [2]) == 1000
    assert shared_prefix([7], [8]) == 0


def test_the_entry_with_the_longest_shared_prefix_is_found():
    cache = PromptCache(None)
    cache.put([1, 2, 3, 4, 5], state(5))
    cache.put([1, 2, 7, 8], state(4))
    entry, n = cache.best([1, 2, 7, 8, 9, 10])
    assert entry.tokens == [1, 2, 7, 8] and n == 4
    entry, n = cache.best([1, 2, 3, 0])
    assert entry.tokens == [1, 2, 3, 4, 5] and n == 3
    assert cache.best([9, 9]) == (None, 0)


def test_an_entry_another_covers_is_not_kept_twice():
    cache = PromptCache(None)
    assert cache.put([1, 2, 3], state(3))
    assert cache.put([1, 2, 3, 4, 5], state(5))  # extends the first: replaces it
    assert [e.tokens for e in cache.entries] == [[1, 2, 3, 4, 5]]
    assert not cache.put([1, 2, 3], state(3))  # covered by the longer one
    assert not cache.put([1, 2, 3, 4, 5], state(5))
    assert len(cache.entries) == 1 and cache.counters.saves == 2


def test_least_recently_used_entries_go_first_and_bytes_never_exceed_the_cap():
    one = state_bytes(state(10))
    cache = PromptCache(3 * one)
    for i in range(3):
        cache.put([i] * 10, state(10))
    cache.best([0] * 10)
    cache.restored(cache.entries[0], 10)  # entry 0 used: entry 1 is now the oldest
    cache.put([3] * 10, state(10))
    assert sorted(e.tokens[0] for e in cache.entries) == [0, 2, 3]
    assert cache.counters.evictions == 1 and cache.n_bytes <= 3 * one
    assert not cache.put([4] * 40, state(40))  # alone over the cap: not kept, nothing evicted
    assert len(cache.entries) == 3 and cache.n_bytes <= 3 * one


def test_the_token_limit_bounds_the_entries_too():
    cache = PromptCache(None, limit_tokens=25)
    cache.put([1] * 10, state(10))
    cache.put([2] * 10, state(10))
    cache.put([3] * 10, state(10))
    assert cache.n_tokens <= 25 and [e.tokens[0] for e in cache.entries] == [2, 3]


def test_with_a_byte_limit_the_token_limit_grows_to_what_the_bytes_hold():
    """llama-server's rule: a context-sized token limit does not cap a cache whose
    byte limit holds more (32 conversations of 600 tokens on a 2,048-token context)."""
    one = state_bytes(state(10))
    cache = PromptCache(100 * one, limit_tokens=25)
    for i in range(8):
        cache.put([i] * 10, state(10))
    assert len(cache.entries) == 8 and cache.counters.evictions == 0
    small = PromptCache(3 * one, limit_tokens=25)
    for i in range(8):
        small.put([i] * 10, state(10))
    assert len(small.entries) == 3 and small.n_tokens == 30  # raised from 25 to the 30 tokens the bytes hold


def test_cache_ram_follows_llama_servers_values():
    assert PromptCache.from_mib(-1).limit_bytes is None
    assert PromptCache.from_mib(8192).limit_bytes == 8192 * MIB
    off = PromptCache.from_mib(0)
    assert not off.enabled and not off.put([1], state(1)) and off.entries == []
    with pytest.raises(ValueError, match="cache-ram"):
        PromptCache.from_mib(-2)
