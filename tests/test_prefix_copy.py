"""seq_cp of a prefix into a second sequence, then continuing, equals a fresh run."""

from __future__ import annotations

import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def run(engine: Engine, prompt: list[int], seq_id: int, n_cached: int = 0) -> list[int]:
    seq = engine.add_sequence(prompt, GREEDY, seq_id=seq_id, n_cached=n_cached)
    while engine.has_work:
        engine.step()
    return seq.output_ids


def test_prefix_copy_then_suffix_removal_matches_fresh_run(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama")
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=3, block_size=8)
    gen = torch.Generator().manual_seed(3)
    first = torch.randint(0, 300, (40,), generator=gen).tolist()
    second = first[:16] + torch.randint(0, 300, (9,), generator=gen).tolist()
    run(engine, first, seq_id=0)
    used_before = engine.memory.store.pool.n_used
    engine.memory.seq_cp(0, 1)  # all of sequence 0 ...
    engine.memory.seq_rm(1, 16)  # ... minus everything after the 16-token prefix
    assert engine.memory.store.pool.n_used == used_before  # the prefix is shared, not stored twice
    assert engine.memory.store.tables[1] == engine.memory.store.tables[0][:2]
    assert all(engine.memory.store.pool.refcount[b] == 2 for b in engine.memory.store.tables[1])
    reused = run(engine, second, seq_id=1, n_cached=16)
    fresh = run(engine, second, seq_id=2)
    assert reused == fresh
    engine.memory.integrity_check()
    # sequence 0 is untouched by sequence 1's appends (copy-on-write)
    assert engine.memory.seq_len(0) == len(first) + 15
    assert run(engine, first, seq_id=0, n_cached=len(first)) == run(engine, first, seq_id=2)
