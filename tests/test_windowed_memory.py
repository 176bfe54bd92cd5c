"""Sliding-window models (Mistral, Gemma 2, Gemma 3, Gemma 3n, Gemma 4) after the slot
operations, against transformers: a prefix copy to another slot, cuts back into the
window (exact while the ring holds it), a cut back to the prompt's end after the window
has moved past it (a checkpoint), a cut too far back (recomputed, never served from
wrong cells), and save -> restore."""

from __future__ import annotations

import pytest
import torch
from checkpoints import GEMMA3N_TINY, GEMMA4_TINY, greedy_reference, load_reference, make_checkpoint

from engine import Engine, SamplingParams

WINDOWED = {
    "mistral": ("mistral", {"sliding_window": 8}),
    "gemma2": ("gemma2", {"num_hidden_layers": 4, "sliding_window": 8, "query_pre_attn_scalar": 24}),
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 16}),
    "gemma3n": ("gemma3n", GEMMA3N_TINY),
    "gemma4": ("gemma4", {**GEMMA4_TINY, "sliding_window": 8}),
}
STEP = 16  # tokens per step and sequence: the ring holds window - 1 + STEP cells
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module", params=list(WINDOWED))
def model(request, tmp_path_factory):
    arch, overrides = WINDOWED[request.param]
    folder = make_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", arch, **overrides)
    engine = Engine.from_pretrained(str(folder), n_ctx=1024, n_seq_max=4, max_batch_tokens=STEP, block_size=8)
    return engine, load_reference(folder)


def run(engine: Engine, prompt: list[int], slot: int, n_cached: int, n_new: int = 8) -> tuple:
    """Generate in ``slot`` reusing up to ``n_cached`` cached tokens -> (tokens, logits, tokens reused)."""
    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    seq = engine.add_sequence(prompt, params, slot, n_cached)
    reused = seq.n_computed
    logits = []
    while engine.has_work:
        logits += [e.logits for e in engine.step(keep_logits=True) if e.seq is seq and e.logits is not None]
    engine.memory.integrity_check()
    return seq.output_ids, torch.stack(logits), reused


def check(engine_out: tuple, ref, prompt: list[int]) -> None:
    tokens, logits, _ = engine_out
    ref_tokens, ref_logits = greedy_reference(ref, prompt, len(tokens))
    assert tokens == ref_tokens
    torch.testing.assert_close(logits, ref_logits.float(), atol=1e-4, rtol=0)


def test_slot_operations_on_a_windowed_model(model):
    engine, ref = model
    engine.memory.seq_rm(-1)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 300, (40,), generator=gen).tolist()
    extra = torch.randint(0, 300, (6,), generator=gen).tolist()

    first = run(engine, prompt, 0, 0, n_new=30)  # 40 + 30 tokens: the ring no longer holds the prompt's end
    check(first, ref, prompt)
    held = prompt + first[0][:-1]  # the last sampled token is not computed yet
    assert engine.memory.seq_pos_min(0) == len(held) - (8 - 1 + STEP)  # what the window's ring still holds
    assert engine.memory.seq_pos_max(0) == len(held) - 1

    engine.memory.seq_cp(0, 1)  # a prefix copy of everything slot 0 holds
    extended = held + extra
    copied = run(engine, extended, 1, len(held))
    assert copied[2] == len(held)
    check(copied, ref, extended)

    near = held[:-5] + extra  # the common prefix ends 5 tokens before the cache's end: inside the ring
    state = engine.memory.save_seq(0)
    cut = run(engine, near, 0, len(held) - 5)
    assert cut[2] == len(held) - 5
    check(cut, ref, near)

    engine.memory.load_seq(2, state)  # save -> restore into another slot
    restored = run(engine, extended, 2, len(held))
    assert restored[2] == len(held)
    check(restored, ref, extended)

    turn = prompt + extra  # a new last turn after the first prompt: the ring moved on, its checkpoint did not
    back = run(engine, turn, 0, len(prompt))
    assert back[2] == len(prompt)
    check(back, ref, turn)

    engine.memory.load_seq(3, state)  # a restored slot has the window, no checkpoints
    far = prompt[:10] + extra  # too far back for the window: recomputed from the start
    again = run(engine, far, 3, 10)
    assert again[2] == 0
    check(again, ref, far)
