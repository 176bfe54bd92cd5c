"""llama-server's samplers (engine/sampling/chain.py, dry.py): each one's draws over
4,000 seeds follow the distribution its definition gives (a plain-Python reference of
llama.cpp's algorithm, chi-square at 0.1 %), and differ from the distribution without
it; the order of the chain matters as named; mirostat's state moves as defined; DRY's
penalties equal a brute-force reading; post-sampling probabilities are the final
distribution; and a seed gives the same token alone or in a batch."""

from __future__ import annotations

import math

import pytest
import torch
from stats import assert_drawn_from

from engine import DEMO_MODEL
from engine.sampling.dry import dry_penalties
from engine.sampling.params import LLAMA_ORDER, OPENAI_ORDER, DryBreakers, SamplingParams
from engine.sampling.sampler import SampleRow, sample
from engine.text.tokenizer import Tokenizer

N = 4000
LOGITS = [3.0, 2.6, 2.5, 2.0, 1.2, 1.0, 0.4, 0.0, -0.5, -1.5, -2.0, -4.0, -6.0, -9.0, -12.0, -15.0]


def draw(params: SamplingParams, logits=LOGITS, n: int = N, mu=None) -> list[int]:
    rows = [SampleRow(params, seed, [0], [], mu) for seed in range(n)]
    return sample(torch.tensor([logits] * n), rows).tokens


def softmax(cands: dict[int, float]) -> dict[int, float]:
    top = max(cands.values())
    ex = {t: math.exp(v - top) for t, v in cands.items()}
    total = sum(ex.values())
    return {t: e / total for t, e in ex.items()}


def cands(logits=LOGITS) -> dict[int, float]:
    return dict(enumerate(logits))


def by_prob(c: dict[int, float]) -> list[int]:
    return sorted(c, key=lambda t: -c[t])


def base(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "samplers": LLAMA_ORDER, **kw})


def test_top_n_sigma_keeps_logits_within_n_deviations():
    n = 1.0
    vals = list(LOGITS)
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    kept = {t: v for t, v in cands().items() if v >= max(vals) - n * std}
    assert 1 < len(kept) < len(vals)
    assert_drawn_from(draw(base(top_n_sigma=n)), softmax(kept))


def test_typical_p_keeps_the_locally_typical_tokens():
    p = softmax(cands())
    entropy = -sum(q * math.log(q) for q in p.values())
    order = sorted(p, key=lambda t: abs(-math.log(p[t]) - entropy))
    kept, cum = {}, 0.0
    for t in order:
        kept[t] = LOGITS[t]
        cum += p[t]
        if cum > 0.5:
            break
    assert 0 not in kept or len(kept) < 4  # not simply the top tokens
    assert_drawn_from(draw(base(typical_p=0.5)), softmax(kept))


def test_xtc_removes_the_top_choices_but_the_least_of_them():
    p = softmax(cands())
    above = [t for t in by_prob(p) if p[t] >= 0.1]
    assert len(above) >= 3
    kept = {t: v for t, v in cands().items() if t not in above[:-1]}
    assert_drawn_from(draw(base(xtc_probability=1.0, xtc_threshold=0.1)), softmax(kept))
    half = draw(base(xtc_probability=0.5, xtc_threshold=0.1))  # a fair coin per step and seed
    mixed = {t: 0.5 * p[t] + 0.5 * softmax(kept).get(t, 0.0) for t in p}
    assert_drawn_from(half, mixed)


def test_dynamic_temperature_follows_the_entropy():
    temp, spread, exponent = 1.0, 0.8, 3.0
    p = softmax(cands())
    norm = -sum(q * math.log(q) for q in p.values()) / math.log(len(p))
    t = (temp - spread) + 2 * spread * norm**exponent
    assert abs(t - temp) > 0.1  # a temperature other than the fixed one
    expected = softmax({k: v / t for k, v in cands().items()})
    assert_drawn_from(draw(base(dynatemp_range=spread, dynatemp_exponent=exponent)), expected)


def test_the_chain_order_decides_what_temperature_sees():
    hot = {"temperature": 3.0, "top_p": 0.6}
    p = softmax(cands())
    keep_first = []  # llama-server's order: top-p on the raw distribution, then temperature
    for t in by_prob(p):
        if sum(p[k] for k in keep_first) >= 0.6:
            break
        keep_first.append(t)
    flat = softmax({t: v / 3.0 for t, v in cands().items()})
    keep_after = []  # OpenAI's: temperature, then top-p on the flattened one
    for t in by_prob(flat):
        if sum(flat[k] for k in keep_after) >= 0.6:
            break
        keep_after.append(t)
    assert len(keep_after) > len(keep_first)
    llama = draw(SamplingParams(**hot, samplers=LLAMA_ORDER))
    assert_drawn_from(llama, softmax({t: LOGITS[t] / 3.0 for t in keep_first}))
    assert_drawn_from(
        draw(SamplingParams(**hot, samplers=OPENAI_ORDER)),
        softmax({t: flat_l for t, flat_l in ((t, LOGITS[t] / 3.0) for t in keep_after)}),
    )  # noqa: E501
    only_temp = draw(SamplingParams(**hot, samplers=("temperature",)))  # top-p left out of the chain: not applied
    assert_drawn_from(only_temp, flat)


def test_mirostat_2_truncates_by_surprise_and_moves_mu():
    tau, eta = 3.0, 0.1
    p = softmax(cands())
    mu = 2 * tau  # its start
    kept = {t: LOGITS[t] for t in p if -math.log2(p[t]) <= mu}
    params = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=tau, mirostat_eta=eta)
    assert_drawn_from(draw(params), softmax(kept))
    rows = [SampleRow(params, 3, [0], [])]
    out = sample(torch.tensor([LOGITS]), rows)
    final = softmax(kept)
    assert out.mu[0] == pytest.approx(mu - eta * (-math.log2(final[out.tokens[0]]) - tau), rel=1e-5)
    tight = draw(params, mu=1.0)  # a lower mu keeps fewer tokens
    assert set(tight) == {t for t in p if -math.log2(p[t]) <= 1.0} | {0}


def test_mirostat_1_keeps_the_top_k_its_estimate_gives():
    tau, vocab = 2.5, len(LOGITS)
    p = [softmax(cands())[t] for t in range(vocab)]  # already sorted
    m = min(100, vocab) - 1
    t_i = [math.log((i + 2) / (i + 1)) for i in range(m)]
    b_i = [math.log(p[i] / p[i + 1]) for i in range(m)]
    s_hat = sum(a * b for a, b in zip(t_i, b_i)) / sum(a * a for a in t_i)
    eps = s_hat - 1
    k = max(int(((eps * 2 ** (2 * tau)) / (1 - vocab ** (-eps))) ** (1 / s_hat)), 1)
    assert 1 < k < vocab
    params = SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=tau)
    assert_drawn_from(draw(params), softmax({t: LOGITS[t] for t in range(k)}))


def brute_dry(history: list[int], p: SamplingParams) -> dict[int, float]:
    """DRY read off directly: for each earlier position, how far the text before it
    matches the context's end (not reaching past the latest breaker)."""
    h = history if p.dry_penalty_last_n < 0 else history[-p.dry_penalty_last_n :]
    n, limit = len(h), len(h)
    rev = h[::-1]
    for i in range(n):  # the latest breaker, read backwards
        hits = [len(s) - 1 for s in p.dry_breakers.sequences if rev[i] == s[0] and len(s) - 1 <= i
                and all(s[1 + j] == rev[i - 1 - j] for j in range(len(s) - 1))]  # fmt: skip
        if hits:
            limit = i - max(hits)
            break
    if limit < p.dry_allowed_length:
        return {}
    best: dict[int, int] = {}
    for j in range(n - 1):  # h[j] ends an earlier stretch; h[j + 1] followed it
        length = 0
        while length < j + 1 and h[j - length] == h[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= p.dry_allowed_length:
            best[h[j + 1]] = max(best.get(h[j + 1], 0), length)
    single = {s[0] for s in p.dry_breakers.sequences if len(s) == 1}
    return {t: p.dry_multiplier * p.dry_base ** (L - p.dry_allowed_length) for t, L in best.items() if t not in single}


def test_dry_penalties_equal_a_brute_force_reading():
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_breakers=((9,), (7, 8)))
    for trial in range(300):
        vocab = 4 if trial % 2 else 10
        history = torch.randint(0, vocab, (int(torch.randint(1, 60, (1,), generator=gen)),), generator=gen).tolist()
        assert dry_penalties(history, params) == pytest.approx(brute_dry(history, params)), history
    rep = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]  # "1 2 3 4" repeats: 5 would extend it to five tokens
    assert dry_penalties(rep, params) == {5: pytest.approx(0.8 * 1.75**2)}
    assert dry_penalties([1, 2, 3, 4, 9, 1, 2, 3], params) == {4: pytest.approx(0.8 * 1.75)}  # a breaker between
    assert dry_penalties([1, 2, 3, 9, 5, 1, 2, 3], params) == {}  # a breaker inside the match


def test_a_breaker_is_every_token_sequence_that_writes_it():
    """llama.cpp's reading: a token whose text contains the breaker breaks on its own; a
    token that ends with the breaker's start is followed by the rest's tokens."""
    tok = Tokenizer.from_folder(DEMO_MODEL)
    vocab = tok.vocab_bytes
    assert vocab == [tok.token_bytes(i) for i in range(tok.vocab_size)]
    newline = {s[0] for s in tok.breaker_sequences("\n")}
    assert newline == {i for i, w in enumerate(vocab) if b"\n" in w} and len(newline) > 10
    text = "### Response:"
    s = text.encode()
    expected = set()
    for i, w in enumerate(vocab):
        if s in w:
            expected.add((i,))
            continue
        for k in range(1, len(s)):  # the token ends with the breaker's first k bytes
            if w.endswith(s[:k]):
                expected.add((i, *tok.encode(s[k:].decode(), False)))
    got = tok.breaker_sequences(text)
    assert set(got) == expected and len(got) == len(expected)
    assert sum(len(x) > 1 for x in got) > 3  # '#', '##', ' #', ... start it


def test_a_token_that_writes_a_breaker_among_other_text_breaks_a_repeat():
    tok = Tokenizer.from_folder(DEMO_MODEL)
    nn = next(i for i, w in enumerate(tok.vocab_bytes) if b"\n" in w and len(w) > 1)  # "\n\n", ":\n", ...
    history = [100, nn, 101, 102, 100, nn, 101]  # "100 nn 101" repeats: 102 would extend it, across nn
    as_tokenized = SamplingParams(dry_multiplier=0.8, dry_breakers=(tuple(tok.encode("\n", False)),))
    assert dry_penalties(history, as_tokenized) == {102: pytest.approx(0.8 * 1.75)}  # nn is not "\n"'s token
    every = SamplingParams(dry_multiplier=0.8, dry_breakers=DryBreakers(tok.breaker_sequences("\n")))
    assert dry_penalties(history, every) == {}  # the repeat may not reach back past nn


def test_dry_lowers_the_token_that_extends_a_repeat():
    history = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    params = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_breakers=())
    logits = [0.0] * 16
    rows = [SampleRow(params, s, history, []) for s in range(N)]
    got = sample(torch.tensor([logits] * N), rows).tokens
    expected = softmax({t: (-0.8 * 1.75**2 if t == 5 else 0.0) for t in range(16)})
    assert_drawn_from(got, expected)


def test_repeat_last_n_penalizes_the_window_only():
    params = SamplingParams(temperature=0.0, repetition_penalty=50.0, repeat_last_n=3)
    logits = torch.tensor([[5.0, 4.9, 1.0]])
    far = sample(logits, [SampleRow(params, 0, [0, 2, 2, 2], [])]).tokens  # 0 is 4 tokens back: outside
    near = sample(logits, [SampleRow(params, 0, [2, 2, 0], [])]).tokens  # 0 is in the window
    assert far == [0] and near == [1]
    vllm = SamplingParams(temperature=0.0, repetition_penalty=50.0)  # no window: the whole prompt counts
    assert sample(logits, [SampleRow(vllm, 0, [0, 2, 2, 2], [])]).tokens == [1]


def test_post_sampling_probs_are_the_final_distribution():
    params = base(top_k=3, logprobs=3, post_sampling_probs=True)
    out = sample(torch.tensor([LOGITS]), [SampleRow(params, 1, [0], [])])
    final = softmax({t: LOGITS[t] for t in range(3)})
    assert out.top_ids[0] == [0, 1, 2]
    assert [math.exp(x) for x in out.top_logprobs[0]] == pytest.approx([final[t] for t in range(3)], rel=1e-5)
    assert math.exp(out.logprobs[0]) == pytest.approx(final[out.tokens[0]], rel=1e-5)
    pre = sample(torch.tensor([LOGITS]), [SampleRow(base(top_k=3, logprobs=3), 1, [0], [])])
    assert pre.top_logprobs[0][0] < out.top_logprobs[0][0]  # before truncation: less probable


def test_a_seed_draws_the_same_alone_and_in_a_batch():
    every = [
        base(top_n_sigma=1.5),
        base(typical_p=0.7),
        base(xtc_probability=0.6, xtc_threshold=0.1),
        base(dynatemp_range=0.5),
        SamplingParams(temperature=0.9, mirostat=2),
        SamplingParams(temperature=0.9, mirostat=1),
        base(dry_multiplier=1.0, dry_breakers=((9,),)),
    ]
    rows = [SampleRow(p, 100 + i, [0, 1, 2, 0, 1], [2], 4.0 if p.mirostat else None) for i, p in enumerate(every)]
    batch = sample(torch.tensor([LOGITS] * len(rows)), rows)
    for i, r in enumerate(rows):
        alone = sample(torch.tensor([LOGITS]), [r])
        assert alone.tokens[0] == batch.tokens[i]
        if r.params.mirostat:
            assert alone.mu[0] == pytest.approx(batch.mu[i])
