"""Recurrent memory (memory/recurrent/recurrent_memory.py), and Mamba2 and the Granite 4 hybrid (Mamba2 +
attention + MoE, hybrid memory) against transformers: greedy tokens and logits, chunked
prefill mixed with decode, prefixes reused through checkpoints, seq_cp and save ->
restore."""

from __future__ import annotations

import pytest
import torch
from checkpoints import (
    FALCON_H1_TINY,
    GRANITE_HYBRID_TINY,
    JAMBA_TINY,
    LFM2_MOE_TINY,
    LFM2_TINY,
    NEMOTRON_H_TINY,
    QWEN3_5_MOE_TINY,
    QWEN3_5_TINY,
    QWEN3_NEXT_TINY,
    greedy_reference,
    load_reference,
    make_checkpoint,
)

from engine import Engine, SamplingParams
from memory import MemoryBatch, RecurrentMemory, RecurrentSpec, SeqState, StateMismatch

N_STEPS = 32
EVERY = 16  # checkpoint spacing of these tests: prompts span several


ARCHS = {
    "mamba2": {},
    "granitemoehybrid": GRANITE_HYBRID_TINY,
    "falconh1": FALCON_H1_TINY,
    "jamba": JAMBA_TINY,
    "lfm2": LFM2_TINY,
    "lfm2_moe": LFM2_MOE_TINY,
    "nemotron_h": NEMOTRON_H_TINY,
    "qwen3_5": QWEN3_5_TINY,
    "qwen3_5_moe": QWEN3_5_MOE_TINY,
    "qwen3_next": QWEN3_NEXT_TINY,
}


@pytest.fixture(scope="module", params=list(ARCHS))
def mamba2(tmp_path_factory, request):
    """A tiny recurrent (Mamba2) or hybrid (Granite 4) checkpoint and its reference."""
    folder = make_checkpoint(tmp_path_factory.mktemp("m") / request.param, request.param, **ARCHS[request.param])
    return folder, load_reference(folder)


def checkpoints_meta(state) -> str:
    return state.meta.get("checkpoints", state.meta.get("rec.checkpoints"))


def engine_of(folder, **kw) -> Engine:
    args = dict(n_ctx=1024, n_seq_max=4, max_batch_tokens=40, ssm_checkpoint_every=EVERY, ssm_checkpoints=4)
    return Engine.from_pretrained(str(folder), **{**args, **kw})


def prompts_of(seed: int, lengths) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 300, (n,), generator=gen).tolist() for n in lengths]  # 0 is the reference's pad


def run(engine: Engine, prompts: list[list[int]], slots, n_steps=N_STEPS, n_cached=None):
    params = SamplingParams(temperature=0.0, max_tokens=n_steps, ignore_eos=True)
    n_cached = n_cached or [0] * len(prompts)
    seqs = [engine.add_sequence(p, params, seq_id=s, n_cached=c) for p, s, c in zip(prompts, slots, n_cached)]
    run.starts = [s.n_computed for s in seqs]  # where each resumed
    logits = {i: [] for i in range(len(seqs))}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    return seqs, logits


def assert_matches(ref, prompt, tokens, logits, n_steps=N_STEPS):
    ref_tokens, ref_logits = greedy_reference(ref, prompt, n_steps)
    assert tokens == ref_tokens
    for step, (ours, theirs) in enumerate(zip(logits, ref_logits)):
        torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=0, msg=f"step {step}")


@pytest.mark.parametrize("unified", [False, True])
def test_batched_greedy_matches_transformers(mamba2, unified):
    folder, ref = mamba2
    engine = engine_of(folder, kv_unified=unified)
    assert engine.memory.kind in ("recurrent", "hybrid") and not engine.memory.can_shift
    prompts = prompts_of(1, (1, 7, 30, 75))  # 75: several checkpoint intervals, chunks of 8 in the scan
    seqs, logits = run(engine, prompts, (2, 0, 3, 1))
    for i, p in enumerate(prompts):
        assert_matches(ref, p, seqs[i].output_ids, logits[i])
    assert engine.memory.checkpoints(1) == [64, 74, 80, 96]  # the prompt's end but one (pinned) and the newest 3
    engine.memory.integrity_check()


def test_a_turn_start_is_checkpointed_and_the_next_turn_resumes_there(mamba2):
    """A chat prompt whose generation prompt begins 3 tokens before its end (where the
    next turn's history writes it otherwise, as Qwen3.5's template drops ``<think>``):
    its state there is kept, so the next turn computes from it, not from the spaced
    checkpoint before; the answer is still transformers'."""
    folder, ref = mamba2
    engine = engine_of(folder)
    (first,) = prompts_of(4, (45,))
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_sequence(first, params, seq_id=0, turn_start=42)
    while engine.has_work:
        engine.step()
    assert 42 in engine.memory.checkpoints(0)
    follow = first[:42] + prompts_of(5, (6,))[0]  # the history diverges where the generation prompt began
    seqs, logits = run(engine, [follow], [0], n_cached=[42])
    assert run.starts == [42]
    assert_matches(ref, follow, seqs[0].output_ids, logits[0])


def test_prefix_reuse_restarts_from_the_latest_checkpoint(mamba2):
    folder, ref = mamba2
    engine = engine_of(folder)
    (first,) = prompts_of(2, (40,))
    run(engine, [first], [0], n_steps=4)
    assert engine.memory.checkpoints(0) == [16, 32, 39]  # spaced, and the prompt's end but one
    follow = first[:37] + prompts_of(3, (9,))[0]  # shares 37 tokens: the state resumes from 32
    assert engine.memory.seq_cut_point(0, 37) == 32
    seqs, logits = run(engine, [follow], [0], n_cached=[37])
    assert run.starts == [32]
    assert_matches(ref, follow, seqs[0].output_ids, logits[0])
    same = first + prompts_of(4, (5,))[0]  # extends the whole first prompt: resumes at 40
    engine.memory.seq_rm(0)
    run(engine, [first], [0], n_steps=1)
    assert engine.memory.seq_cut_point(0, 40) == 40
    seqs, logits = run(engine, [same], [0], n_cached=[40])
    assert run.starts == [40]
    assert_matches(ref, same, seqs[0].output_ids, logits[0])


def test_a_short_follow_up_turn_hits_its_prompt_checkpoint(mamba2):
    """Shorter than one spacing: the checkpoint before the prompt's last token is what
    makes it a hit; the same prompt again (an answer regenerated) computes one token."""
    folder, ref = mamba2
    engine = engine_of(folder, ssm_checkpoint_every=512)
    (first,) = prompts_of(5, (11,))
    seqs, _ = run(engine, [first], [1], n_steps=6)
    answer = seqs[0].output_ids
    follow = first + answer[:3] + [7, 8, 9]  # re-rendered answer diverges after 3 tokens
    assert engine.memory.seq_cut_point(1, len(first) + 3) == len(first) - 1
    seqs, logits = run(engine, [follow], [1], n_cached=[len(first) + 3])
    assert run.starts == [len(first) - 1]
    assert_matches(ref, follow, seqs[0].output_ids, logits[0])
    seqs, logits = run(engine, [first], [1], n_cached=[len(first) - 1], n_steps=6)  # regenerated
    assert run.starts == [len(first) - 1] and seqs[0].output_ids == answer


def test_seq_cp_and_save_restore_continue_exactly(mamba2, tmp_path):
    folder, ref = mamba2
    engine = engine_of(folder)
    (prompt,) = prompts_of(6, (35,))
    seqs, _ = run(engine, [prompt], [0], n_steps=5)
    held = prompt + seqs[0].output_ids[:4]  # what slot 0's state has consumed
    assert engine.memory.seq_len(0) == len(held)
    engine.memory.seq_cp(0, 2)
    state = engine.memory.save_seq(0)
    assert checkpoints_meta(state) == "16,32,34"
    fresh = engine_of(folder)
    fresh.memory.load_seq(3, state)
    assert fresh.memory.checkpoints(3) == [16, 32, 34]
    extra = prompts_of(7, (6,))[0]
    for eng, slot in ((engine, 2), (fresh, 3)):
        seqs, logits = run(eng, [held + extra], [slot], n_cached=[len(held)])
        assert_matches(ref, held + extra, seqs[0].output_ids, logits[0])
    fresh.memory.seq_rm(3)
    fresh.memory.load_seq(3, state)  # back to a checkpoint of the restored state
    seqs, logits = run(fresh, [prompt[:32] + extra], [3], n_cached=[33])
    assert_matches(ref, prompt[:32] + extra, seqs[0].output_ids, logits[0])


# ---- the memory's own contract ---------------------------------------------------


def small_memory(**kw) -> RecurrentMemory:
    spec = RecurrentSpec((6, 3), (2, 4, 5), torch.float32)
    return RecurrentMemory({0: spec, 2: spec}, n_seq_max=3, **kw)


def feed(mem: RecurrentMemory, seq: int, n: int, value: float) -> None:
    """Consume n positions, writing a recognizable state."""
    start = mem.seq_pos_max(seq) + 1
    view = mem.prepare(MemoryBatch([seq], [n], torch.arange(start, start + n)))
    conv, ssm = view.states(0)
    view.store(0, conv + value, ssm + value)
    view.store(2, *(t - value for t in view.states(2)))


def test_seq_rm_is_exact_or_refused_unchanged():
    mem = small_memory(n_checkpoints=2)
    feed(mem, 0, 10, 1.0)
    mem.checkpoint(0)
    feed(mem, 0, 5, 2.0)
    before = mem.save_seq(0)
    assert mem.seq_rm(0, 12) is False  # no checkpoint there
    assert mem.seq_rm(0, 3, 7) is False  # the middle
    assert mem.seq_rm(-1, 12) is False  # all or nothing over every sequence
    after = mem.save_seq(0)
    assert all(torch.equal(before.tensors[k], after.tensors[k]) for k in before.tensors)
    assert mem.seq_len(0) == 15 and mem.seq_cut_point(0, 12) == 10 and mem.seq_cut_point(0, 9) == 0
    assert mem.seq_rm(0, 20) is True and mem.seq_len(0) == 15  # past the end: nothing to drop
    assert mem.seq_rm(0, 10) is True and mem.seq_len(0) == 10
    assert torch.equal(mem.conv[0][0], torch.full((6, 3), 1.0))  # the state at 10, not at 15
    assert torch.equal(mem.ssm[2][0], torch.full((2, 4, 5), -1.0))
    with pytest.raises(NotImplementedError):
        mem.seq_add(0, 0, None, 3)
    mem.seq_rm(0)
    assert mem.seq_len(0) == 0 and mem.checkpoints(0) == [] and not mem.conv[0][0].any()
    mem.integrity_check()


@pytest.mark.parametrize("arch", ["qwen3_5", "mamba2"])
def test_without_the_compiled_steps_the_torch_ones_match_transformers(tmp_path, monkeypatch, arch):
    """The decode steps' torch forms (no compiler: the gated delta rule's bmm step, the
    convolution as a concatenation and a sum): the same tokens and logits."""
    from engine.models import delta_rule, ssm

    monkeypatch.setattr(delta_rule, "_blocks", None)
    monkeypatch.setattr(ssm, "_blocks", None)
    folder = make_checkpoint(tmp_path / arch, arch, **ARCHS[arch])
    prompts = prompts_of(3, (5, 20))
    seqs, logits = run(engine_of(folder), prompts, (0, 1), n_steps=12)
    ref = load_reference(folder)
    for i, p in enumerate(prompts):
        assert_matches(ref, p, seqs[i].output_ids, logits[i], n_steps=12)


def test_checkpoints_are_bounded_and_copied_with_the_state():
    """Beyond the bound the oldest but the first goes: the first (a first prompt's end,
    what conversations with the same system prompt share) and the newest stay."""
    mem = small_memory(n_checkpoints=3)
    for i in range(5):
        feed(mem, 1, 4, float(i + 1))
        mem.checkpoint(1)
    assert mem.checkpoints(1) == [4, 16, 20]
    use = mem.usage(held_by=[1]).groups[0]
    assert use.kind == "recurrent" and use.n_blocks_held == 4 and use.bytes_per_block == mem.bytes_per_seq
    mem.seq_cp(1, 2, 0, 16)
    assert mem.seq_len(2) == 16 and mem.checkpoints(2) == [4, 16]
    assert torch.equal(mem.conv[0][2], torch.full((6, 3), 10.0))  # 1 + 2 + 3 + 4: the state at 16
    mem.seq_cp(1, 0, 0, 4)
    assert torch.equal(mem.conv[0][0], torch.full((6, 3), 1.0))  # the first: the state at 4
    with pytest.raises(ValueError):
        mem.seq_cp(1, 0, 0, 12)  # dropped: not a cut point any more
    mem.integrity_check()


def test_a_first_prompts_end_outlasts_the_checkpoints_spaced_before_it():
    """A long first prompt leaves spaced checkpoints, then its end (pinned): beyond the
    bound the pinned end stays, not the first spaced one, so another conversation with
    the same first prompt restarts there; the pin travels with copies and goes with cuts."""
    mem = small_memory(n_checkpoints=3)
    for _ in range(3):  # spaced, while the prompt is computed
        feed(mem, 1, 4, 1.0)
        mem.checkpoint(1)
    feed(mem, 1, 3, 1.0)
    mem.checkpoint(1, pin=True)  # the prompt's end (all but its last token)
    for _ in range(3):  # later turns
        feed(mem, 1, 5, 1.0)
        mem.checkpoint(1)
    assert mem.checkpoints(1) == [15, 25, 30]
    mem.seq_cp(1, 2, 0, 25)
    feed(mem, 2, 5, 1.0)
    mem.checkpoint(2)
    feed(mem, 2, 5, 1.0)
    mem.checkpoint(2)
    assert mem.checkpoints(2) == [15, 30, 35]  # the copy's pin stays too
    mem.seq_rm(1, 15)
    feed(mem, 1, 20, 1.0)
    for _ in range(3):
        feed(mem, 1, 1, 1.0)
        mem.checkpoint(1)
    assert mem.checkpoints(1) == [15, 37, 38]  # a cut keeps the pin up to it
    assert mem.seq_rm(1, 15) is True and mem.checkpoints(1) == [15]
    mem.integrity_check()


def test_a_restored_state_keeps_its_prompts_end_pinned():
    """A slot file carries which checkpoints are a prompt's end: restored, later turns
    push out the spaced checkpoints, not the pinned end. A file naming a pin that is no
    checkpoint is refused before the slot changes; one from before pins loads unpinned."""
    mem = small_memory(n_checkpoints=3)
    for _ in range(2):
        feed(mem, 1, 4, 1.0)
        mem.checkpoint(1)
    feed(mem, 1, 3, 1.0)
    mem.checkpoint(1, pin=True)
    saved = mem.save_seq(1)
    assert saved.meta["checkpoints"] == "4,8,11" and saved.meta["pinned"] == "11"
    mem.load_seq(2, saved)
    for _ in range(2):
        feed(mem, 2, 5, 1.0)
        mem.checkpoint(2)
    assert mem.checkpoints(2) == [11, 16, 21]
    feed(mem, 0, 2, 9.0)
    before = mem.save_seq(0)
    bad = SeqState(saved.positions, saved.tensors, {**saved.meta, "pinned": "5"})
    with pytest.raises(StateMismatch):
        mem.load_seq(0, bad)
    assert torch.equal(mem.save_seq(0).tensors["conv.0"], before.tensors["conv.0"])
    unpinned = SeqState(saved.positions, saved.tensors, {k: v for k, v in saved.meta.items() if k != "pinned"})
    mem.load_seq(2, unpinned)
    for _ in range(2):
        feed(mem, 2, 5, 1.0)
        mem.checkpoint(2)
    assert mem.checkpoints(2) == [4, 16, 21]
    mem.integrity_check()


def test_a_held_point_cuts_back_without_displacing_checkpoints():
    """``hold`` (speculation's rollback point): a cut back to it is exact; it is not
    listed, saved or copied, evicts no checkpoint, and a cut before it drops it."""
    mem = small_memory(n_checkpoints=1)
    feed(mem, 0, 10, 1.0)
    mem.checkpoint(0)
    feed(mem, 0, 4, 2.0)
    mem.hold(0)
    feed(mem, 0, 3, 3.0)
    assert mem.checkpoints(0) == [10] and mem.seq_cut_point(0, 15) == 14
    saved = mem.save_seq(0)
    assert saved.meta["checkpoints"] == "10" and len(saved.tensors) == 2 * 2 * 2  # state + checkpoint, 2 layers
    mem.seq_cp(0, 1, 0, 10)
    assert mem.seq_cut_point(1, 14) == 10  # the copy holds nothing
    assert mem.seq_rm(0, 14) is True and mem.seq_len(0) == 14
    assert torch.equal(mem.conv[0][0], torch.full((6, 3), 3.0))  # 1 + 2: the state at 14
    assert mem.seq_rm(0, 10) is True and mem.seq_cut_point(0, 13) == 10  # cut before it: gone
    mem.integrity_check()


def test_a_state_from_another_memory_is_refused_unchanged():
    mem = small_memory()
    feed(mem, 0, 6, 1.0)
    good = mem.save_seq(0)
    other = RecurrentMemory({0: RecurrentSpec((6, 3), (2, 4, 4), torch.float32)}, 1)
    with pytest.raises(StateMismatch):
        other.load_seq(0, good)
    bad = type(good)(good.positions, dict(good.tensors), {**good.meta, "memory_kind": "kv_stream"})
    feed(mem, 1, 2, 5.0)
    with pytest.raises(StateMismatch):
        mem.load_seq(1, bad)
    assert mem.seq_len(1) == 2 and torch.equal(mem.conv[0][1], torch.full((6, 3), 5.0))


@pytest.mark.parametrize("field", ["mamba_n_heads", "mamba_d_state"])
def test_a_hybrid_config_missing_a_layout_field_is_a_load_error_naming_it(tmp_path, field):
    import json

    from engine.errors import CheckpointError

    folder = make_checkpoint(tmp_path / "g", "granitemoehybrid", **GRANITE_HYBRID_TINY)
    config = json.loads((folder / "config.json").read_text())
    del config[field]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=field):
        Engine.from_pretrained(str(folder))


def test_follow_up_turns_hit_the_cache_at_every_prompt_length(tmp_path):
    """The issue's lengths: a follow-up that re-renders the end of the answer resumes at
    the prompt's checkpoint, one token before its end (not at 0), and answers what a
    cold run answers."""
    folder = make_checkpoint(tmp_path / "g", "granitemoehybrid", **GRANITE_HYBRID_TINY, max_position_embeddings=8192)
    engine = Engine.from_pretrained(str(folder), n_ctx=2 * 4608, n_seq_max=2)  # default spacing and checkpoints
    for n in (64, 256, 1024, 4096):
        (prompt,) = prompts_of(n, (n,))
        answer = run(engine, [prompt], [0], n_steps=6)[0][0].output_ids
        follow = prompt + answer[:3] + [5, 6, 7]  # the last answer tokens re-rendered differently
        warm, _ = run(engine, [follow], [0], n_steps=4, n_cached=[n + 3])
        assert run.starts == [n if n % 512 == 0 else n - 1], f"prompt of {n}"  # a spaced one at the end itself
        cold, _ = run(engine, [follow], [1], n_steps=4)
        assert run.starts == [0] and warm[0].output_ids == cold[0].output_ids


def test_older_hub_spellings_of_a_hybrid_config_load_the_same_model(tmp_path):
    """Granite 4 hub configs say "mamba"/"attention" (or layers_block_type) and write
    infinity as a bare JSON Infinity; transformers 5 writes linear_attention /
    full_attention and {"__float__": "Infinity"}."""
    import json

    folder = make_checkpoint(tmp_path / "g", "granitemoehybrid", **GRANITE_HYBRID_TINY)
    (prompt,) = prompts_of(8, (20,))
    new = run(engine_of(folder), [prompt], [0], n_steps=8)[0][0].output_ids
    config = json.loads((folder / "config.json").read_text())
    assert config["layer_types"][0] == "linear_attention"
    config["layers_block_type"] = ["mamba", "mamba", "attention", "mamba"]
    del config["layer_types"]
    text = json.dumps({**config, "time_step_limit": [0.0, float("inf")]})  # json writes a bare Infinity
    assert "Infinity]" in text
    (folder / "config.json").write_text(text)
    old = run(engine_of(folder), [prompt], [0], n_steps=8)[0][0].output_ids
    assert old == new


def test_an_older_lfm2_config_loads_the_same_model(tmp_path):
    """LFM2 hub configs before transformers 5 list the attention layers as
    ``full_attn_idxs`` instead of ``layer_types`` (issue 52)."""
    import json

    folder = make_checkpoint(tmp_path / "l", "lfm2", **LFM2_TINY)
    (prompt,) = prompts_of(9, (20,))
    new = run(engine_of(folder), [prompt], [0], n_steps=8)[0][0].output_ids
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    config["full_attn_idxs"] = [1, 3]
    (folder / "config.json").write_text(json.dumps(config))
    engine = engine_of(folder)
    assert [s.kind for s in engine.model.layer_specs(torch.float32)] == ["recurrent", "attention_full"] * 2
    assert run(engine, [prompt], [0], n_steps=8)[0][0].output_ids == new
