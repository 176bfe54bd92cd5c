"""Smaller attention caches (llama-server's -ctk/-ctv: f16, bf16, q8_0): every KV kind
stores the type it is given, logits stay within the type's stated tolerance of
transformers' float32 ones (greedy tokens equal but where the reference's top two are within
twice the tolerance), and a state of one type never restores into a cache of another.

The tolerance: a 16-bit key or value moves by at most half a unit in its last place,
2^-11 of itself in f16 and 2^-8 in bf16; a q8_0 one by at most max|x| / 254 over its
block of 32. Through attention and the layers after it, the logits of these tiny models
(|logit| up to ~4) moved by at most the figures in MEASURED (2026-11-25); the bounds are
3x those."""

from __future__ import annotations

import pytest
import torch
from checkpoints import greedy_reference, load_reference, make_checkpoint

from engine import Engine, SamplingParams
from memory import FullAttentionSpec, MemoryConfig, SeqState, SlidingWindowSpec, StateMismatch, build_memory
from memory.kv_codec import CODECS
from memory.protocol import MemoryBatch

MEASURED = {"f16": 1.6e-3, "bf16": 1.3e-2, "q8_0": 3.8e-2}  # the largest of the three cases
TOLERANCE = {kv: 3 * worst for kv, worst in MEASURED.items()}
STORAGE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "q8_0": torch.uint8}
CASES = {  # (arch, overrides, engine settings): a pool, streams, a sliding-window ring
    "unified": ("llama", {}, dict(kv_unified=True)),
    "stream": ("llama", {}, dict(kv_unified=False)),
    "ring": ("mistral", {"sliding_window": 8}, dict(kv_unified=True)),
}
N_STEPS = 16


@pytest.mark.parametrize("kv", list(MEASURED))
@pytest.mark.parametrize("case", list(CASES))
def test_smaller_caches_stay_within_their_tolerance(tmp_path, case, kv):
    arch, overrides, settings = CASES[case]
    if kv == "q8_0":  # blocks of 32 values: the heads must hold whole blocks
        overrides = {**overrides, "head_dim": 32}
    folder = make_checkpoint(tmp_path / arch, arch, **overrides)
    engine = Engine.from_pretrained(
        str(folder), n_ctx=256, n_seq_max=2, block_size=8, cache_type_k=kv, cache_type_v=kv, **settings
    )
    specs = [s for s in engine.layer_specs if hasattr(s, "v_codec")]
    assert specs and all(s.k_codec.name == s.v_codec.name == kv for s in specs)
    prompt = torch.randint(1, 300, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=N_STEPS, ignore_eos=True), 0)
    logits = []
    while engine.has_work:
        logits += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
    ref_tokens, ref_logits = greedy_reference(load_reference(folder), prompt, N_STEPS)
    worst, same = 0.0, 0
    for ours, theirs, token, ref in zip(logits, ref_logits, seq.output_ids, ref_tokens):
        worst = max(worst, (ours - theirs.float()).abs().max().item())
        if token != ref:  # a lossy cache may pick the other of two near-equal tokens; then the inputs differ
            top2 = theirs.float().topk(2).values
            assert top2[0] - top2[1] <= 2 * TOLERANCE[kv], "a greedy token changed where no near tie explains it"
            break
        same += 1
    assert same >= 4
    print(f"{case} {kv}: worst logit difference {worst:.2e}")
    assert worst <= TOLERANCE[kv]
    assert worst > 1e-6  # the type really rounds: not a float32 cache under another name
    state = engine.memory.save_seq(0)
    assert (state.meta["k_type"], state.meta["v_type"]) == (kv, kv)
    assert {t.dtype for t in state.tensors.values()} == {STORAGE[kv]}


def _memory(kind: str, cache_k: str, cache_v: str):
    spec = (
        SlidingWindowSpec(2, 32, torch.float32, window=4, cache_k=cache_k, cache_v=cache_v)
        if kind == "ring"
        else FullAttentionSpec(2, 32, torch.float32, cache_k=cache_k, cache_v=cache_v)
    )
    cfg = MemoryConfig(n_ctx=64, n_seq_max=2, block_size=4, layout="stream" if kind == "stream" else "unified")
    return build_memory([spec, spec], cfg), spec


def _fill(memory, n: int) -> None:
    """n positions of sequence 0, keys and values 1.0 + position / 1000 (not exact in 16 bits)."""
    view = memory.prepare(MemoryBatch([0], [n], torch.arange(n)))
    x = (1.0 + torch.arange(n, dtype=torch.float32) / 1000)[:, None, None].expand(n, 2, 32)  # [n, KVH, D]
    q = torch.zeros(n, 2, 32)
    for layer in (0, 1):
        view.attend(layer, q, x, x)


@pytest.mark.parametrize("kind", ["unified", "stream", "ring"])
@pytest.mark.parametrize("types", [("f16", "bf16"), ("q8_0", "f16")], ids=["f16-bf16", "q8_0-f16"])
def test_each_kind_stores_its_types_and_refuses_a_state_of_other_types(kind, types):
    (memory, spec), (other, _) = _memory(kind, *types), _memory(kind, "f32", "f32")
    assert spec.bytes_per_token == 2 * sum(CODECS[t].bytes_per_row(32) for t in types)
    assert spec.bytes_per_token < 2 * 2 * 32 * 4  # less than float32's
    _fill(memory, 6)
    state = memory.save_seq(0)
    assert state.tensors["k.0"].dtype == STORAGE[types[0]] and state.tensors["v.0"].dtype == STORAGE[types[1]]
    assert (state.meta["k_type"], state.meta["v_type"]) == types
    expected = 1.0 + torch.arange(6, dtype=torch.float32)[:, None, None].expand(6, 2, 32) / 1000
    assert torch.allclose(spec.k_codec.decode(state.tensors["k.0"]), expected, atol=1e-2, rtol=0)
    _fill(other, 3)
    with pytest.raises(StateMismatch, match="--cache-type-k"):
        other.load_seq(0, state)
    assert other.seq_len(0) == 3  # unchanged
    wrong_v = "f32" if types[1] != "f32" else "f16"
    mixed = SeqState(state.positions, {**state.tensors, "v.0": state.tensors["v.0"].to(STORAGE[wrong_v])}, state.meta)
    with pytest.raises(StateMismatch, match="--cache-type-v"):
        memory.load_seq(1, mixed)
    memory.load_seq(1, state)  # its own types: restores
    assert torch.equal(memory.save_seq(1).tensors["v.1"], state.tensors["v.1"])


def test_q8_0_rows_round_trip_within_half_a_step():
    codec = CODECS["q8_0"]
    x = torch.randn(5, 3, 64) * torch.logspace(-3, 2, 64)  # [N, KVH, D], blocks of very different sizes
    rows = codec.encode(x)
    assert rows.shape == (5, 3, 64 + 4) and rows.dtype == torch.uint8  # 64 int8 values, two float16 scales
    back = codec.decode(rows)
    step = x.reshape(5, 3, 2, 32).abs().amax(-1, keepdim=True) / 127  # [N, KVH, G, 1]
    err = (back - x).reshape(5, 3, 2, 32).abs()
    assert bool((err <= step * 0.5 * 1.01 + 1e-7).all())  # (the float16 scale rounds too: 1%)
    assert torch.equal(codec.encode(back), rows)  # stored values are fixed points
    assert torch.equal(codec.decode(rows.transpose(0, 1)), back.transpose(0, 1))  # strided views decode too
