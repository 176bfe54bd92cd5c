"""Context shift: a sequence that fills its context drops old tokens and goes on.

With one layer, every cached K/V depends only on its token and position, so after the
shift (re-rotated keys, positions moved down) the next step must equal a fresh run on
the kept tokens. With more layers the kept K/V still carry the dropped context — an
approximation llama.cpp makes as well — so exactness is only checkable at one layer."""

from __future__ import annotations

import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams

N_CTX = 48


def test_shift_continues_like_a_fresh_run_on_the_kept_tokens(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama", num_hidden_layers=1)
    shifting = Engine.from_pretrained(str(folder), n_ctx=N_CTX, n_seq_max=1, block_size=8, context_shift=True)
    fresh = Engine.from_pretrained(str(folder), n_ctx=N_CTX, n_seq_max=1, block_size=8)
    prompt = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    seq = shifting.add_sequence(prompt, params, seq_id=0, n_keep=5)
    while len(seq.tokens) < N_CTX:
        shifting.step()
    assert seq.n_shifted == 0  # the shift waits for the next step, before its forward
    (event,) = shifting.step(keep_logits=True)
    kept = seq.tokens[:-1]  # after the shift; the last token is the one this step sampled
    assert seq.n_shifted > 0 and kept[:5] == prompt[:5]  # n_keep tokens survive
    assert len(kept) < N_CTX and seq.n_computed == len(kept)
    assert shifting.memory.seq_pos_max(0) == seq.n_computed - 1  # positions moved down, no gap
    shifting.memory.integrity_check()
    ref = fresh.add_sequence(kept, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), seq_id=0)
    events = []
    while fresh.has_work:
        events += [e for e in fresh.step(keep_logits=True) if e.logits is not None]
    torch.testing.assert_close(event.logits, events[0].logits, atol=1e-4, rtol=1e-4)
    assert event.token_id == ref.output_ids[0]
    while shifting.has_work:
        shifting.step()
    assert len(seq.output_ids) == 200 and seq.finish_reason == "length"  # generated past the context


def test_without_shift_a_full_context_stops_with_length(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama")
    engine = Engine.from_pretrained(str(folder), n_ctx=N_CTX, n_seq_max=1, block_size=8)
    seq = engine.add_sequence(list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True), 0)
    while engine.has_work:
        engine.step()
    assert seq.finish_reason == "length" and len(seq.tokens) == N_CTX
