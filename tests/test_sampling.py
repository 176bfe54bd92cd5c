"""The batched sampler: seeds, truncation masks, penalties, logit_bias, logprobs."""

from __future__ import annotations

import math

import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams
from engine.sampling.sampler import SampleRow, sample, uniform

V = 50


def row(params: SamplingParams, seed: int = 7, prompt=(1,), out=()) -> SampleRow:
    return SampleRow(params, seed, list(prompt), list(out))


def draws(logits: torch.Tensor, params: SamplingParams, n: int = 400) -> set[int]:
    """Tokens chosen over n different seeds for one row of logits."""
    rows = [row(params, seed=s) for s in range(n)]
    return set(sample(logits.repeat(n, 1), rows).tokens)


def test_uniform_is_a_pure_function_and_spread():
    seeds = torch.arange(1000, dtype=torch.long) * 7919
    u = uniform(seeds, torch.zeros(1000, dtype=torch.long))
    assert torch.equal(u, uniform(seeds, torch.zeros(1000, dtype=torch.long)))
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.05


def test_top_k_top_p_min_p_masks():
    logits = torch.linspace(0, -4.9, V)[None]  # token 0 most likely, strictly decreasing
    assert draws(logits, SamplingParams(temperature=1.0, top_k=3)) == {0, 1, 2}
    probs = logits.softmax(-1)[0]
    p = float(probs[:4].sum()) - 1e-4  # the first 4 tokens are needed to pass p
    assert draws(logits, SamplingParams(temperature=1.0, top_p=p)) == {0, 1, 2, 3}
    ratio = float(probs[5] / probs[0]) + 1e-6  # tokens 0..4 pass min_p, 5 does not
    assert draws(logits, SamplingParams(temperature=1.0, min_p=ratio)) == {0, 1, 2, 3, 4}
    assert len(draws(logits, SamplingParams(temperature=1.0))) > 20


def test_greedy_logit_bias_and_penalties():
    logits = torch.zeros(1, V)
    logits[0, 3] = 2.0
    assert sample(logits.clone(), [row(SamplingParams(temperature=0))]).tokens == [3]
    biased = SamplingParams(temperature=0, logit_bias={9: 5.0})
    assert sample(logits.clone(), [row(biased)]).tokens == [9]
    pres = SamplingParams(temperature=0, presence_penalty=2.0)
    assert sample(logits.clone(), [row(pres, out=[3])]).tokens != [3]
    freq = SamplingParams(temperature=0, frequency_penalty=0.6)
    assert sample(logits.clone(), [row(freq, out=[3, 3])]).tokens == [3]  # 2 - 1.2 > 0
    assert sample(logits.clone(), [row(freq, out=[3, 3, 3, 3])]).tokens != [3]  # 2 - 2.4 < 0
    rep = SamplingParams(temperature=0, repetition_penalty=4.0)
    assert sample(logits.clone(), [row(rep, prompt=[3])]).tokens == [3]  # 2/4 still > 0
    negative = torch.full((1, V), -1.0)
    negative[0, 3] = -0.5
    assert sample(negative.clone(), [row(rep, prompt=[3])]).tokens != [3]  # -0.5*4 < -1


def test_logprobs_are_normalized_and_top_sorted():
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0, logprobs=5)
    out = sample(logits.clone(), [row(params), row(params)])
    for i in range(2):
        assert out.top_ids[i][0] == out.tokens[i]
        assert math.isclose(out.logprobs[i], out.top_logprobs[i][0], abs_tol=1e-6)
        assert out.top_logprobs[i] == sorted(out.top_logprobs[i], reverse=True)
        assert math.isclose(float(logits[i].log_softmax(-1).exp().sum()), 1.0, rel_tol=1e-5)
        assert sum(math.exp(x) for x in out.top_logprobs[i]) <= 1.0 + 1e-6


def test_seed_gives_same_tokens_whatever_the_batch(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama", noise=0.02)
    engine = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=4, block_size=8)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=1234, ignore_eos=True)
    other = SamplingParams(temperature=1.2, max_tokens=25, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9]
    alone = engine.generate([prompt], seeded)[0].token_ids
    mixed = engine.generate([[1, 2, 3], prompt, list(range(40, 90)), [11]], [other, seeded, other, other])
    assert mixed[1].token_ids == alone
    other_seed = engine.generate([prompt], SamplingParams(**{**seeded.__dict__, "seed": 99}))[0].token_ids
    assert other_seed != alone
