"""Embeddings in the engine (engine/core/pooling.py): each pooling equals transformers'
``last_hidden_state`` pooled the same way (fp32, 1e-5), on attention, sliding-window,
recurrent and hybrid models, over chunked prompts, beside a generating sequence that
keeps its exact tokens, and after a prefix the slot already holds."""

from __future__ import annotations

import pytest
import torch
from checkpoints import GRANITE_HYBRID_TINY, greedy_reference, load_reference, make_checkpoint

from engine import Engine, SamplingParams

ARCHS = {
    "llama": ("llama", {}),
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 16}),
    "mamba2": ("mamba2", {}),
    "granitemoehybrid": ("granitemoehybrid", GRANITE_HYBRID_TINY),
}


def reference(model, prompt: list[int], pooling: str) -> torch.Tensor:
    """transformers' final hidden states of ``prompt`` pooled: [k, hidden]."""
    with torch.no_grad():
        h = model.base_model(torch.tensor([prompt])).last_hidden_state[0].float()  # [T, hidden]
    return {"none": h, "mean": h.mean(0, keepdim=True), "cls": h[:1], "last": h[-1:]}[pooling]


def embed(engine: Engine, prompt: list[int], pooling: str, seq_id: int = 0, n_cached: int = 0) -> torch.Tensor:
    seq = engine.add_sequence(prompt, SamplingParams(max_tokens=1), seq_id, n_cached, pooling=pooling)
    result = None
    while seq in engine.running:
        for ev in engine.step():
            if ev.seq is seq and ev.finished:
                assert ev.error is None
                result = ev.embedding
    assert seq.output_ids == [] and result is not None  # nothing was sampled
    return torch.tensor(result)


@pytest.mark.parametrize("case", ARCHS)
def test_every_pooling_equals_transformers_over_chunked_prompts(tmp_path, case):
    arch, overrides = ARCHS[case]
    folder = make_checkpoint(tmp_path / case, arch, **overrides)
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=2, max_batch_tokens=16, block_size=8)
    ref = load_reference(folder)
    prompt = torch.randint(0, 300, (41,), generator=torch.Generator().manual_seed(3)).tolist()  # 3 chunks of 16
    for pooling in ("none", "mean", "cls", "last"):
        ours = embed(engine, prompt, pooling)
        theirs = reference(ref, prompt, pooling)
        assert ours.shape == theirs.shape, pooling
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=pooling)
    engine.memory.integrity_check()


def test_an_embedding_beside_generation_changes_neither(tmp_path):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=2, max_batch_tokens=12, block_size=8)
    ref = load_reference(folder)
    gen = torch.Generator().manual_seed(5)
    talk, text = (torch.randint(0, 300, (n,), generator=gen).tolist() for n in (9, 50))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    talking = engine.add_sequence(talk, params, seq_id=0)
    embedding = engine.add_sequence(text, SamplingParams(max_tokens=1), seq_id=1, pooling="mean")
    steps_together, result = 0, None
    while engine.has_work:
        events = engine.step()
        steps_together += any(e.seq is talking for e in events) and embedding in engine.running
        result = next((e.embedding for e in events if e.seq is embedding and e.finished), result)
    assert steps_together >= 3  # the 50-token prompt ran in chunks while the other sequence decoded
    assert talking.output_ids == greedy_reference(ref, talk, 20)[0]
    torch.testing.assert_close(torch.tensor(result), reference(ref, text, "mean"), atol=1e-5, rtol=0)


def test_a_cached_prefix_is_used_only_where_the_pooling_allows(tmp_path):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1, max_batch_tokens=64, block_size=8)
    ref = load_reference(folder)
    prompt = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(7)).tolist()
    for pooling in ("last", "mean"):
        embed(engine, prompt, pooling)  # the slot now holds the prompt's cache
        seq = engine.add_sequence(prompt, SamplingParams(max_tokens=1), 0, n_cached=30, pooling=pooling)
        assert seq.n_computed == (29 if pooling == "last" else 0)
        engine.abort(seq)
        again = embed(engine, prompt, pooling, n_cached=30)
        torch.testing.assert_close(again, reference(ref, prompt, pooling), atol=1e-5, rtol=0, msg=pooling)
