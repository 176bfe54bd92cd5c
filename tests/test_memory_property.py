"""Random sequences of memory operations against a plain-Python reference, for every
KV layout (unified pool, per-stream)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memory import CacheFull, FullAttentionSpec, Memory, MemoryBatch, PagedKVCache
from memory.attention.stream_kv import StreamKVCache

N_SEQ = 3


def shift(layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    out = k.clone()
    out[:, 0, 1] += delta.to(k.dtype)  # the "rotation" moves the stored position channel
    return out


SPEC = FullAttentionSpec(n_kv_heads=1, head_dim=2, dtype=torch.float32)


def new_cache(n_blocks: int, block_size: int, layout: str = "unified") -> Memory:
    if layout == "stream":  # the same number of cells, split into one stream per sequence
        return StreamKVCache({0: SPEC}, N_SEQ, max(1, n_blocks * block_size // N_SEQ), rope_shift=shift)
    return PagedKVCache({0: SPEC}, n_blocks=n_blocks, n_seq_max=N_SEQ, block_size=block_size, rope_shift=shift)


def observed(cache: Memory, seq: int) -> list[tuple[int, int]]:
    state = cache.save_seq(seq)
    k = state.tensors["k.0"]  # [n, 1, 2]: (tag, position)
    pos = state.positions.tolist()
    assert k[:, 0, 1].long().tolist() == pos, "stored keys disagree with cell positions"
    return list(zip(k[:, 0, 0].long().tolist(), pos))


def do_prepare(cache, ref, seq, n, tag):
    """Through the forward view, as a model writes: each key holds (tag, position)."""
    start = ref[seq][-1][1] + 1 if ref[seq] else 0
    positions = torch.arange(start, start + n)
    view = cache.prepare(MemoryBatch([seq], [n], positions))
    kv = torch.stack([torch.full((n,), float(tag)), positions.float()], -1)[:, None, :]  # [n, 1, 2]
    out = view.attend(0, torch.zeros(n, 1, 2), kv, kv.clone())  # [n, 1, 2]
    assert torch.isfinite(out).all()
    ref[seq] += [(tag, p) for p in positions.tolist()]


def in_range(p, p0, p1):
    return p >= p0 and (p1 is None or p < p1)


op = st.one_of(
    st.tuples(st.just("prepare"), st.integers(0, N_SEQ - 1), st.integers(1, 11)),
    st.tuples(st.just("rm"), st.integers(0, N_SEQ - 1), st.integers(0, 30), st.one_of(st.none(), st.integers(0, 40))),
    st.tuples(
        st.just("cp"),
        st.integers(0, N_SEQ - 1),
        st.integers(0, N_SEQ - 1),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 40)),
    ),
    st.tuples(st.just("keep"), st.integers(0, N_SEQ - 1)),
    st.tuples(
        st.just("add"),
        st.integers(0, N_SEQ - 1),
        st.integers(0, 30),
        st.one_of(st.none(), st.integers(0, 40)),
        st.integers(-12, 12),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(op, max_size=30),
    block_size=st.sampled_from([1, 2, 4, 16]),
    n_blocks=st.integers(3, 40),
    layout=st.sampled_from(["unified", "stream"]),
)
def test_random_operations_match_reference(ops, block_size, n_blocks, layout):
    cache = new_cache(n_blocks, block_size, layout)
    ref: list[list[tuple[int, int]]] = [[] for _ in range(N_SEQ)]
    for i, (name, *args) in enumerate(ops):
        before = [list(r) for r in ref]
        try:
            if name == "prepare":
                do_prepare(cache, ref, args[0], args[1], tag=i)
            elif name == "rm":
                seq, p0, p1 = args
                cache.seq_rm(seq, p0, p1)
                ref[seq] = [c for c in ref[seq] if not in_range(c[1], p0, p1)]
            elif name == "cp":
                src, dst, p0, p1 = args
                cache.seq_cp(src, dst, p0, p1)
                if src != dst:
                    ref[dst] = [c for c in ref[src] if in_range(c[1], p0, p1)]
            elif name == "keep":
                cache.seq_keep(args[0])
                ref = [r if s == args[0] else [] for s, r in enumerate(ref)]
            else:
                seq, p0, p1, delta = args
                cache.seq_add(seq, p0, p1, delta)
                moved = [(t, p + delta if in_range(p, p0, p1) else p) for t, p in ref[seq]]
                ref[seq] = [c for c in moved if c[1] >= 0]
        except CacheFull:
            ref = before  # all-or-nothing: the cache must still equal the old reference
        cache.integrity_check()
        for seq in range(N_SEQ):
            assert observed(cache, seq) == ref[seq], f"after op {i} {name}{tuple(args)}"
            want = [p for _, p in ref[seq]]
            assert cache.seq_pos_min(seq) == (min(want) if want else -1)
            assert cache.seq_pos_max(seq) == (max(want) if want else -1)
    cache.seq_keep(0)
    cache.seq_rm(0)
    cache.integrity_check()
    assert cache.usage().groups[0].n_blocks_used == 0  # nothing leaked


def test_prefix_copy_shares_blocks_and_copy_on_write():
    cache = new_cache(n_blocks=10, block_size=4)
    ref = [[] for _ in range(N_SEQ)]
    do_prepare(cache, ref, 0, 10, tag=1)  # 3 blocks, the last half full
    cache.seq_cp(0, 1)
    assert cache.store.pool.n_used == 3 and cache.store.tables[0] == cache.store.tables[1]
    do_prepare(cache, ref, 1, 1, tag=2)  # writes into the shared last block: copied first
    tables = cache.store.tables
    assert tables[0][:2] == tables[1][:2] and tables[0][2] != tables[1][2]
    assert cache.store.pool.n_used == 4
    assert observed(cache, 0) == [(1, p) for p in range(10)]
    cache.integrity_check()


def test_cache_full_leaves_state_unchanged():
    cache = new_cache(n_blocks=3, block_size=4)
    ref = [[] for _ in range(N_SEQ)]
    do_prepare(cache, ref, 0, 10, tag=1)
    try:
        do_prepare(cache, ref, 1, 5, tag=2)
    except CacheFull:
        pass
    else:
        raise AssertionError("expected CacheFull")
    assert cache.seq_len(1) == 0 and cache.seq_len(0) == 10 and cache.store.pool.n_free == 0
    cache.integrity_check()
