"""Blocks kept by the hash of their tokens in the unified pool (vLLM's automatic prefix
caching): a finished sequence's whole blocks outlive it, a later prompt with the same
start takes them without computing, a kept block is never written (a write copies it),
and an allocation that needs the room evicts the least recently kept."""

from __future__ import annotations

import pytest
import torch

from memory import FullAttentionSpec, MemoryBatch
from memory.attention.block_pool import BlockPool
from memory.attention.paged_kv import PagedKVCache
from memory.attention.prefix_hash import block_hashes
from memory.protocol import IntegrityError

BS = 4
SPEC = FullAttentionSpec(1, 2, torch.float32)


def cache(n_blocks: int = 12) -> PagedKVCache:
    return PagedKVCache({0: SPEC}, n_blocks=n_blocks, n_seq_max=3, block_size=BS)


def write(memory: PagedKVCache, seq: int, tokens: list[int], start: int = 0) -> None:
    """Cache ``tokens`` at positions start.. of ``seq``: each key and value is its token id."""
    n = len(tokens)
    view = memory.prepare(MemoryBatch([seq], [n], torch.arange(start, start + n)))
    kv = torch.tensor(tokens, dtype=torch.float32)[:, None, None].expand(n, 1, 2)  # [n, KVH, D]
    view.attend(0, torch.zeros(n, 1, 2), kv, kv)


def held(memory: PagedKVCache, seq: int) -> list[int]:
    return memory.save_seq(seq).tensors["k.0"][:, 0, 0].long().tolist()


def test_hashes_name_the_whole_prefix():
    a, b = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], BS), block_hashes([1, 2, 3, 4, 5, 6, 7, 9], BS)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]  # the last partial block has none
    assert block_hashes([9, 2, 3, 4, 5, 6, 7, 8], BS)[1] != a[1]  # a block's hash depends on all before it


def test_a_finished_sequence_s_blocks_are_kept_and_taken_by_a_later_prompt():
    memory, tokens = cache(), list(range(10, 24))  # 14 tokens: 3 whole blocks and 2 more
    write(memory, 0, tokens)
    memory.publish_prefix(0, tokens)
    memory.seq_rm(0)
    assert memory.usage().groups[0].n_blocks_cached == 3 and memory.store.pool.n_free == 12
    prompt = tokens[:13] + [99, 98]
    assert memory.cached_prefix(prompt) == 12
    assert memory.attach_prefix(1, prompt) == 12 and memory.usage().groups[0].n_blocks_cached == 0
    assert held(memory, 1) == tokens[:12]
    write(memory, 1, prompt[12:], start=12)  # continues in a new block
    assert held(memory, 1) == prompt
    memory.integrity_check()
    assert memory.attach_prefix(2, [5, 5, 5, 5]) == 0 and memory.seq_len(2) == 0  # nothing kept: unchanged


def test_writing_into_a_kept_block_copies_it_and_the_kept_content_stays():
    memory, tokens = cache(), list(range(30, 42))
    write(memory, 0, tokens)
    memory.publish_prefix(0, tokens)
    memory.seq_rm(0, 10)  # the third block is now partly filled ...
    write(memory, 0, [77, 78], start=10)  # ... and written: into a copy
    assert held(memory, 0) == tokens[:10] + [77, 78]
    assert memory.cached_prefix(tokens) == 12  # the kept block still holds what its hash says
    assert memory.attach_prefix(1, tokens + [1]) == 12 and held(memory, 1) == tokens
    memory.seq_rm(0)
    assert memory.cached_prefix(tokens[:10] + [77, 78]) == 8  # the copy was never published
    memory.integrity_check()


def test_a_shifted_sequence_publishes_only_its_unshifted_blocks():
    shift = lambda layer, k, delta: k  # noqa: E731
    memory = PagedKVCache({0: SPEC}, n_blocks=12, n_seq_max=2, block_size=BS, rope_shift=shift)
    tokens = list(range(50, 62))
    write(memory, 0, tokens)
    memory.seq_add(0, 8, None, -1)  # positions 8.. move down by one (position 7 is now held twice)
    memory.publish_prefix(0, tokens)
    assert memory.cached_prefix(tokens) == 8


def test_allocation_evicts_the_least_recently_kept_blocks_first():
    memory = cache(n_blocks=6)
    old, new = list(range(100, 108)), list(range(200, 208))
    for seq, tokens in ((0, old), (1, new)):
        write(memory, seq, tokens)
        memory.publish_prefix(seq, tokens)
        memory.seq_rm(seq)
    assert memory.store.pool.n_cached == 4 and memory.store.pool.n_free == 6
    write(memory, 2, list(range(16)))  # needs 4: the 2 free, then the 2 kept the longest
    assert memory.cached_prefix(old) == 0 and memory.cached_prefix(new) == 8
    memory.integrity_check()


def test_the_pool_check_catches_a_kept_block_on_the_free_list():
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.publish(b, b"h")
    pool.release(b)
    pool.check({})
    pool._free.append(b)  # a bookkeeping bug
    with pytest.raises(IntegrityError):
        pool.check({})
