"""Hybrid memory (memory/composite/hybrid.py): attention and recurrent halves stay coherent; every
operation the recurrent half refuses leaves the attention half untouched too."""

from __future__ import annotations

import pytest
import torch

from memory import (
    FullAttentionSpec,
    MemoryBatch,
    MemoryConfig,
    RecurrentSpec,
    SlidingWindowSpec,
    StateMismatch,
    build_memory,
)

ATTN = FullAttentionSpec(2, 4, torch.float32)
REC = RecurrentSpec((6, 3), (2, 4, 5), torch.float32)


def hybrid(layout: str = "stream", window: int | None = None, **kw):
    attn = SlidingWindowSpec(2, 4, torch.float32, window) if window else ATTN
    specs = [REC, attn, REC, ATTN]
    cfg = MemoryConfig(256, 3, block_size=4, layout=layout, max_step=8, **kw)
    return build_memory(specs, cfg)


def feed(mem, seq: int, n: int, value: float) -> None:
    """n new positions: keys/values and states filled with ``value``."""
    start = mem.seq_pos_max(seq) + 1
    view = mem.prepare(MemoryBatch([seq], [n], torch.arange(start, start + n)))
    for layer in (1, 3):
        kv = torch.full((n, 2, 4), value)
        view.attend(layer, torch.zeros(n, 2, 4), kv, kv)
    for layer in (0, 2):
        conv, ssm = view.states(layer)
        view.store(layer, conv + value, ssm + value)


def snapshot(mem, seq: int) -> dict:
    state = mem.save_seq(seq)
    return {"positions": state.positions.clone(), **{k: t.clone() for k, t in state.tensors.items()}}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("layout", ["stream", "unified"])
def test_the_recurrent_half_refusing_leaves_attention_untouched(layout):
    mem = hybrid(layout, ssm_checkpoint_every=None)
    assert mem.kind == "hybrid" and not mem.can_shift
    feed(mem, 0, 10, 1.0)
    mem.checkpoint(0)
    feed(mem, 0, 6, 2.0)
    before = snapshot(mem, 0)
    assert mem.seq_rm(0, 12) is False  # attention alone could; the state cannot
    assert mem.seq_rm(0, 2, 5) is False
    with pytest.raises(ValueError):
        mem.seq_cp(0, 1, 0, 13)
    assert same(snapshot(mem, 0), before)
    assert mem.seq_len(1) == 0 and mem.seq_pos_max(1) == -1
    assert mem.seq_cut_point(0, 13) == 10 and mem.seq_cut_point(0, 20) == 16
    assert mem.seq_rm(0, 10) is True  # a checkpoint: both halves go back
    assert mem.seq_pos_max(0) == 9 and mem.attn.seq_pos_max(0) == 9 and mem.rec.seq_pos_max(0) == 9
    mem.seq_cp(0, 2)
    assert mem.seq_pos_max(2) == 9 and mem.checkpoints(2) == [10]
    mem.integrity_check()


def test_states_round_trip_and_a_foreign_state_changes_nothing():
    mem = hybrid()
    feed(mem, 0, 7, 1.0)
    mem.checkpoint(0)
    feed(mem, 0, 2, 3.0)
    state = mem.save_seq(0)
    assert state.meta["hybrid"] == "1" and state.meta["rec.checkpoints"] == "7"
    mem.load_seq(1, state)
    assert same(snapshot(mem, 1), snapshot(mem, 0)) and mem.checkpoints(1) == [7]
    plain = build_memory([ATTN, ATTN], MemoryConfig(256, 3, block_size=4, layout="stream"))
    feed_attn_only = plain.prepare(MemoryBatch([0], [3], torch.arange(3)))
    for layer in (0, 1):
        feed_attn_only.attend(layer, torch.zeros(3, 2, 4), torch.ones(3, 2, 4), torch.ones(3, 2, 4))
    feed(mem, 2, 4, 5.0)
    before = snapshot(mem, 2)
    with pytest.raises(StateMismatch):
        mem.load_seq(2, plain.save_seq(0))  # an attention-only model's state
    with pytest.raises(StateMismatch):
        plain.load_seq(1, state)  # and the reverse
    broken = type(state)(state.positions, dict(state.tensors), {**state.meta, "rec.checkpoints": "99"})
    with pytest.raises(StateMismatch):
        mem.load_seq(2, broken)  # the recurrent half refuses before the attention half moves
    assert same(snapshot(mem, 2), before) and plain.seq_len(1) == 0


def test_cut_points_agree_with_a_sliding_window_half():
    mem = hybrid(window=4, ssm_checkpoint_every=None)
    feed(mem, 0, 6, 1.0)
    mem.checkpoint(0)  # both halves keep a checkpoint at 6
    for _ in range(4):
        feed(mem, 0, 5, 2.0)
    assert mem.rec.seq_cut_point(0, 18) == 6
    q = mem.seq_cut_point(0, 18)
    assert q == 6 and mem.seq_rm(0, q) is True and mem.seq_pos_max(0) == 5
    mem.integrity_check()
