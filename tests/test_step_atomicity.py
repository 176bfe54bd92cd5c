"""A step is all-or-nothing: CacheFull (here from a context shift that needs blocks the
pool does not have, because its cells are shared with another slot) leaves every
sequence and the memory as they were, and no sampled token is ever lost."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams
from memory import CacheFull, MemoryBatch

N_CTX, BS = 32, 4  # a slot holds 32 cells (the model's positions); the pool 16 + 4 blocks of 4
A, B, C, D = 0, 1, 2, 3  # A shifts; B shares A's prefix; C fills the pool; D decodes beside A


def _state(engine: Engine) -> list:
    seqs = [(s.seq_id, list(s.tokens), s.n_computed, s.n_shifted) for s in engine.running]
    mem = []
    for seq in range(4):
        st = engine.memory.save_seq(seq)
        mem.append((st.positions.tolist(), {k: v.clone() for k, v in st.tensors.items()}))
    return [seqs, mem]


def _same(before: list, after: list) -> bool:
    if before[0] != after[0]:
        return False
    for (pos0, t0), (pos1, t1) in zip(before[1], after[1]):
        if pos0 != pos1 or t0.keys() != t1.keys() or any(not torch.equal(t0[k], t1[k]) for k in t0):
            return False
    return True


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("m") / "ckpt", "llama", max_position_embeddings=N_CTX)


def test_cache_full_in_a_context_shift_changes_nothing_and_loses_no_token(folder):
    engine = Engine.from_pretrained(str(folder), n_ctx=2 * N_CTX, n_seq_max=4, block_size=BS, context_shift=True)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    d_params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)  # D never fills its context
    d = engine.add_sequence([5, 6, 7], d_params, D)
    a = engine.add_sequence(list(range(10, 30)), params, A)
    while len(a.tokens) < N_CTX - 1:  # A: one step before the token that fills its context
        engine.step()
    assert a.n_shifted == 0 and a.n_computed == N_CTX - 2
    engine.memory.seq_cp(A, B, 0, a.n_computed // BS * BS)  # B shares A's whole blocks: a shift cannot free them
    n_free = engine.memory.store.pool.n_free
    assert n_free > 0
    engine.memory.prepare(MemoryBatch([C], [n_free * BS], torch.arange(n_free * BS)))  # C takes every free block
    assert engine.memory.store.pool.n_free == 0

    n_full = 0
    for _ in range(200):
        if not engine.has_work:
            break
        before = _state(engine)
        try:
            engine.step()
        except CacheFull:
            n_full += 1
            assert _same(before, _state(engine)), "CacheFull changed a sequence or the memory"
            engine.memory.seq_rm(C)  # room again (what the scheduler does: drop idle caches)
            engine.memory.seq_rm(B)
            continue
        engine.memory.integrity_check()
    assert not engine.has_work and n_full == 1 and a.n_shifted > 0
    assert len(a.output_ids) == 40 and len(d.output_ids) == 20  # no sampled token was dropped

    alone = Engine.from_pretrained(str(folder), n_ctx=2 * N_CTX, n_seq_max=4, block_size=BS)
    ref = alone.add_sequence([5, 6, 7], d_params, D)
    while alone.has_work:
        alone.step()
    assert d.output_ids == ref.output_ids  # D's tokens: exactly those of a run without A
