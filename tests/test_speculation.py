"""Speculative decoding by n-gram lookup (engine/core/speculation.py): the proposals,
and greedy output token for token the same with and without speculation, rejected
proposals included (a skipped rollback would leave their keys for later steps)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import torch
from checkpoints import BASE, LFM2_TINY, QWEN3_5_TINY, make_checkpoint
from server_proc import InProcessServer, metric
from stats import chi2_ppf

from engine import DEMO_MODEL, Engine, SamplingParams
from engine.core.speculation import Speculation, ngram_draft


def test_the_draft_is_what_followed_the_latest_earlier_occurrence():
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3], 3, 4) == [8, 7, 1, 2]
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3], 3, 2) == [9, 1]
    assert ngram_draft([1, 2, 3, 4], 3, 4) == []  # no earlier occurrence
    assert ngram_draft([5, 5, 5], 2, 3) == [5, 5, 5]  # overlapping occurrence: a loop, proposed on
    assert ngram_draft([7, 1, 2, 1, 2], 2, 5) == [1, 2, 1, 2, 1]  # the same as looking up after each token
    assert ngram_draft([4, 1, 2, 3, 1, 2], 2, 2) == [3, 1]
    assert ngram_draft([1, 2, 1, 2], 2, 0) == []


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("spec") / "llama", "llama")


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    motif = torch.randint(1, 300, (12,), generator=gen).tolist()
    return [motif * 4, torch.randint(1, 300, (30,), generator=gen).tolist() + motif * 2]


PROMPTS = _prompts()  # a repeated motif: where lookup proposes


def run(folder, prompts, spec: bool, draft=None, **params):
    engine = Engine.from_pretrained(
        str(folder),
        n_ctx=1024,
        n_seq_max=len(prompts),
        block_size=8,
        spec_type="ngram-simple" if spec else None,
        spec_ngram_size=3,
        spec_draft_max=16,
    )
    if draft is not None:  # proposals from a stand-in draft model
        engine.speculation = Speculation(8, draft=draft)
    forward, run.n_computed = engine.runner.run, 0

    def counted(plan):
        run.n_computed += sum(c.n_tokens for c in plan)
        return forward(plan)

    engine.runner.run = counted
    p = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, **params)
    seqs = [engine.add_sequence(prompt, p, seq_id=i) for i, prompt in enumerate(prompts)]
    logits = {i: [] for i in range(len(prompts))}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    engine.memory.integrity_check()
    run.engine = engine
    return seqs, logits


@pytest.mark.parametrize("params", [{}, {"repetition_penalty": 1.02, "logprobs": 2}], ids=["plain", "penalty"])
def test_greedy_output_is_the_same_with_and_without_speculation(folder, params):
    plain, plain_logits = run(folder, PROMPTS, spec=False, **params)
    fast, fast_logits = run(folder, PROMPTS, spec=True, **params)
    for a, b in zip(plain, fast):
        assert a.output_ids == b.output_ids
        assert [t.logprob for t in a.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-4)
    for i in plain_logits:
        for x, y in zip(plain_logits[i], fast_logits[i]):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
    drafted = sum(s.n_drafted for s in fast)
    accepted = sum(s.n_draft_accepted for s in fast)
    assert accepted > 0 and drafted > accepted  # proposals were kept and rejected both
    assert all(s.n_drafted == 0 for s in plain)


def test_a_server_that_speculates_answers_as_one_that_does_not(tmp_path):
    """The demo model repeating a function (where lookup pays), and the demo model as
    its own draft: the same tokens streamed and not, with ``timings.draft_n`` /
    ``draft_n_accepted`` reported."""
    code = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n\n\n"
    body = {"prompt": code * 3 + "def area(w, h):\n", "n_predict": 48, "temperature": 0, "ignore_eos": True}
    answers = {}
    for name, extra in (
        ("plain", ()),
        ("spec", ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8")),
        ("draft", ("-md", str(DEMO_MODEL), "--spec-draft-n-max", "6", "--draft-p-min", "0.5")),
    ):
        with InProcessServer.from_flags("--metrics", "-np", "2", *extra) as srv:
            srv.wait_ready()
            whole = httpx.post(srv.url + "/completion", json=body, timeout=120).json()
            with httpx.stream("POST", srv.url + "/completion", json={**body, "stream": True}, timeout=120) as r:
                frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            answers[name] = whole
            several = {"prompt": body["prompt"], "n": 2, "max_tokens": 40, "temperature": 0.7, "seed": 3}
            answers[name + "-n2"] = [
                c["text"] for c in httpx.post(srv.url + "/v1/completions", json=several, timeout=120).json()["choices"]
            ]
            if name == "spec":  # llama-server's per-request fields
                answers["limited"] = httpx.post(srv.url + "/completion", json={**body, "speculative.n_max": 2}).json()
                answers["off"] = httpx.post(srv.url + "/completion", json={**body, "speculative.n_min": 9}).json()
            props = httpx.get(srv.url + "/props").json()["speculative"]
            kind = {"spec": "ngram-simple", "draft": "draft-simple"}.get(name)
            assert props["type"] == kind and props["n_max"] == {"spec": 8, "draft": 6}.get(name, 0)
            assert props["model_draft"] == (str(DEMO_MODEL) if name == "draft" else None)
            proposed = metric(srv.url, "slotserve_draft_tokens_total")
            assert (proposed > 0) == bool(extra)
            assert metric(srv.url, "slotserve_draft_tokens_accepted_total") <= proposed
            assert metric(srv.url, "llamacpp:spec_decode_num_draft_tokens_total") == proposed  # llama-server's names
            accepted = metric(srv.url, "llamacpp:spec_decode_num_accepted_tokens_total")
            assert accepted == metric(srv.url, "slotserve_draft_tokens_accepted_total")
            assert (metric(srv.url, "llamacpp:spec_decode_num_drafts_total") > 0) == bool(extra)
            streamed = "".join(json.loads(f).get("content", "") for f in frames)
            assert streamed == whole["content"]
    for name in ("spec", "draft", "limited"):
        assert answers[name]["tokens"] == answers["plain"]["tokens"]
    assert answers["spec-n2"] == answers["draft-n2"] == answers["plain-n2"]  # n > 1, sampled and seeded
    timings = answers["spec"]["timings"]
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert 0 < answers["draft"]["timings"]["draft_n_accepted"] <= answers["draft"]["timings"]["draft_n"]
    assert "draft_n" not in answers["plain"]["timings"]
    assert answers["limited"]["timings"]["draft_n"] < timings["draft_n"]  # per-request limits (llama-server's fields)
    assert "draft_n" not in answers["off"]["timings"]  # a minimum no proposal reaches: nothing verified


class Oracle:
    """A proposer that knows each sequence's plain continuation (``runs``) and spoils
    it now and then, so proposals are kept whole, in part and not at all."""

    def __init__(self, runs: dict[int, list[int]], spoil_every: int = 3):
        self.runs, self.spoil_every, self.calls = runs, spoil_every, dict.fromkeys(runs, 0)
        self.n_proposed = 0

    def propose(self, wants):
        drafts = []
        for seq, n, _ in wants:
            self.calls[seq.seq_id] += 1
            k = len(seq.output_ids)
            draft = list(self.runs[seq.seq_id][k : k + n])
            if draft and self.calls[seq.seq_id] % self.spoil_every == 0:
                j = k % len(draft)
                draft[j] = (draft[j] + 1) % 256
            drafts.append(draft)
            self.n_proposed += len(draft)
        return drafts


def decode(folder, prompts, params, proposer=None, n_max=6):
    """Every prompt to the end, all in one batch; with ``proposer``, each decoding
    sequence is offered up to ``n_max`` proposed tokens a step."""
    engine = Engine.from_pretrained(str(folder), n_ctx=2048, n_seq_max=len(prompts), block_size=8)
    if proposer is not None:
        engine.speculation = Speculation(n_max, draft=proposer, step_tokens=256, max_decoding=256)
    seqs = [engine.add_sequence(prompt, p, seq_id=i) for i, (prompt, p) in enumerate(zip(prompts, params))]
    while engine.has_work:
        engine.step()
    engine.memory.integrity_check()
    return seqs


def test_seeded_sampling_is_the_same_token_for_token_with_proposals(folder):
    """Each proposed token counts only where the request's own seeded draw picks it:
    the output is the plain run's, whatever was proposed (rejection sampling with a
    point proposal), with penalties, truncation and logprobs."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 300, (20,), generator=gen).tolist() for _ in range(3)]
    params = [
        SamplingParams(temperature=0.7, top_k=8, seed=11, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=12, max_tokens=30, repetition_penalty=1.1, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, frequency_penalty=0.5),
    ]
    plain = decode(folder, prompts, params)
    oracle = Oracle({i: s.output_ids for i, s in enumerate(plain)})
    fast = decode(folder, prompts, params, oracle)
    for a, b in zip(plain, fast):
        assert a.output_ids == b.output_ids
        assert [t.logprob for t in a.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-4)
        assert b.n_draft_accepted > 0 and b.n_drafted > b.n_draft_accepted


def test_a_grammar_masks_every_row_of_a_proposal():
    """A constrained request: proposals are cut at the grammar's first forbidden token
    and each row is masked by the grammar's state after the tokens before it; the
    output is the plain run's and always in the language."""
    engine = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=512, n_seq_max=1)
    constraint = engine.grammars.compile("regex", "(ab|ba|c)+d")
    params = [SamplingParams(temperature=0.8, seed=s, max_tokens=24, constraint=constraint) for s in (5, 6)]
    prompts = [engine.tokenizer.encode(t) for t in ("abab", "x = ")]
    plain = decode(DEMO_MODEL, prompts, params)
    oracle = Oracle({i: s.output_ids for i, s in enumerate(plain)}, spoil_every=2)  # spoiled: +1 to a token id
    fast = decode(DEMO_MODEL, prompts, params, oracle)
    for a, b in zip(plain, fast):
        assert a.output_ids == b.output_ids
        assert re.fullmatch("(ab|ba|c)+d?", b.text)
        assert b.n_draft_accepted > 0
    assert oracle.n_proposed > sum(s.n_drafted for s in fast)  # forbidden tokens were cut before the forward


def test_speculative_sampling_keeps_the_target_distribution(folder):
    """Over 3,000 seeds, the first three tokens (top-4 sampling) follow the target's
    own distribution, computed by transformers, when the second and third are
    proposed as unlikely tokens every time (chi-square, 0.1 % level). Accepting
    proposals blindly, or drawing again after a rejection, fails it."""
    from checkpoints import load_reference

    ref, prompt, k = load_reference(folder), [3, 1, 4, 1, 5, 9, 2, 6], 4

    def top(ids):  # the target's top-4 distribution after ids: {token: p}
        logits = ref(torch.tensor([prompt + ids])).logits[0, -1]
        p, t = logits.topk(k).values.softmax(-1), logits.topk(k).indices
        return dict(zip(t.tolist(), p.tolist()))

    expected, proposals = {}, {}
    with torch.no_grad():
        for t1, p1 in top([]).items():
            second = top([t1])
            a = sorted(second, key=second.get)[0]  # the least likely second token is proposed
            third = top([t1, a])
            proposals[t1] = [a, sorted(third, key=third.get)[1]]
            for t2, p2 in second.items():
                for t3, p3 in top([t1, t2]).items():
                    expected[(t1, t2, t3)] = p1 * p2 * p3

    class Unlikely:
        def propose(self, wants):
            return [proposals[seq.output_ids[0]][:n] for seq, n, _ in wants]

    n = 3000
    params = [SamplingParams(temperature=1.0, top_k=k, seed=s, max_tokens=3, ignore_eos=True) for s in range(n)]
    engine = Engine.from_pretrained(str(folder), n_ctx=16 * 500, n_seq_max=500, max_batch_tokens=4096)
    engine.speculation = Speculation(2, draft=Unlikely(), step_tokens=10**4, max_decoding=10**4)
    counts: dict[tuple, int] = {}
    out = engine.generate([prompt] * n, params)
    for g in out:
        counts[tuple(g.token_ids)] = counts.get(tuple(g.token_ids), 0) + 1
    assert set(counts) <= set(expected)
    big = [c for c in expected if expected[c] * n >= 5]  # the rest pooled in one cell
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    wanted = [expected[c] * n for c in big] + [n * (1 - sum(expected[c] for c in big))]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, wanted) if e > 0)
    dof = len(big)
    assert chi2 < chi2_ppf(0.999, dof), (chi2, dof)
    accepted = sum(1 for g in out if g.token_ids[1] == proposals[g.token_ids[0]][0])
    assert 0 < accepted < n  # proposals were kept and refused


@pytest.mark.parametrize(
    "arch,fields",
    [("mamba2", {}), ("qwen3_5", QWEN3_5_TINY), ("lfm2", LFM2_TINY),
     ("gemma3", {"num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 16})],
)  # fmt: skip
def test_memories_that_cannot_cut_anywhere_speculate_from_a_held_checkpoint(tmp_path, arch, fields, caplog):
    """Recurrent states (Mamba2), hybrids (Gated DeltaNet + attention, short
    convolutions + attention) and sliding-window rings: each proposal is verified from a
    checkpoint held before the step, a rejection goes back to it, and the greedy tokens
    and logits are those of plain decoding; the kept checkpoints are left alone."""
    folder = make_checkpoint(tmp_path / arch, arch, **fields)
    plain, plain_logits = run(folder, PROMPTS, spec=False)
    n_plain = run.n_computed
    with caplog.at_level("INFO", logger="slotserve.engine"):
        fast, fast_logits = run(folder, PROMPTS, spec=True, draft=Oracle({s.seq_id: s.output_ids for s in plain}, 2))
    assert "each proposal is verified from a held checkpoint" in caplog.text
    for a, b in zip(plain, fast):
        assert a.output_ids == b.output_ids
    for i in plain_logits:
        for x, y in zip(plain_logits[i], fast_logits[i]):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
    for s in fast:  # every other proposal spoiled: kept whole, in part, not at all
        assert s.n_draft_accepted > 0 and s.n_drafted > s.n_draft_accepted
    spoiled = sum(s.n_drafted - s.n_draft_accepted for s in fast)
    assert run.n_computed <= n_plain + 2 * sum(s.n_drafted for s in fast) - spoiled  # back to the held point only
    end = len(PROMPTS[0]) - (0 if arch == "gemma3" else 1)  # a window's at the end, a state's one before
    assert run.engine.memory.checkpoints(0) == [end]  # as without proposals


def test_a_draft_model_must_cut_anywhere(tmp_path):
    mamba = make_checkpoint(tmp_path / "mamba", "mamba2")
    with pytest.raises(ValueError, match="draft model .* cannot drop rejected"):
        Engine.from_pretrained(
            str(make_checkpoint(tmp_path / "llama", vocab_size=BASE["vocab_size"])),
            n_ctx=256,
            n_seq_max=1,
            model_draft=str(mamba),
        )


def test_context_shifts_with_proposals_give_the_plain_tokens(folder):
    """A slot that fills up and shifts while proposals are verified in it."""
    gen = torch.Generator().manual_seed(5)
    motif = torch.randint(1, 300, (6,), generator=gen).tolist()
    params = [SamplingParams(temperature=0.0, max_tokens=90, ignore_eos=True)]
    runs = {}
    for proposer in (None, "oracle"):
        engine = Engine.from_pretrained(str(folder), n_ctx=48, n_seq_max=1, block_size=8, context_shift=True)
        if proposer:
            engine.speculation = Speculation(6, draft=Oracle({0: runs[None].output_ids}), step_tokens=16)
        seq = engine.add_sequence(motif * 3, params[0], seq_id=0, n_keep=4)
        while engine.has_work:
            engine.step()
        engine.memory.integrity_check()
        runs[proposer] = seq
    assert runs["oracle"].n_shifted > 0 and runs["oracle"].n_draft_accepted > 0
    assert runs["oracle"].output_ids == runs[None].output_ids
