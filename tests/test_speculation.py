"""Speculative decoding by n-gram lookup (engine/core/speculation.py): the proposals,
and greedy output token for token the same with and without speculation, rejected
proposals included (a skipped rollback would leave their keys for later steps)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from checkpoints import make_checkpoint
from server_proc import ServerProcess, metric

from engine import Engine, SamplingParams
from engine.core.speculation import ngram_draft


def test_the_draft_is_what_followed_the_latest_earlier_occurrence():
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3], 3, 4) == [8, 7, 1, 2]
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3], 3, 2) == [9, 1]
    assert ngram_draft([1, 2, 3, 4], 3, 4) == []  # no earlier occurrence
    assert ngram_draft([5, 5, 5], 2, 3) == [5]  # overlapping occurrence
    assert ngram_draft([1, 2, 1, 2], 2, 0) == []


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("spec") / "llama", "llama")


def run(folder, prompts, spec: bool, **params):
    engine = Engine.from_pretrained(
        str(folder),
        n_ctx=1024,
        n_seq_max=len(prompts),
        block_size=8,
        spec_type="ngram-simple" if spec else None,
        spec_ngram_size=3,
        spec_draft_max=16,
    )
    p = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, **params)
    seqs = [engine.add_sequence(prompt, p, seq_id=i) for i, prompt in enumerate(prompts)]
    logits = {i: [] for i in range(len(prompts))}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    engine.memory.integrity_check()
    return seqs, logits


@pytest.mark.parametrize("params", [{}, {"repetition_penalty": 1.02, "logprobs": 2}], ids=["plain", "penalty"])
def test_greedy_output_is_the_same_with_and_without_speculation(folder, params):
    gen = torch.Generator().manual_seed(0)
    motif = torch.randint(1, 300, (12,), generator=gen).tolist()
    prompts = [motif * 4, torch.randint(1, 300, (30,), generator=gen).tolist() + motif * 2]
    plain, plain_logits = run(folder, prompts, spec=False, **params)
    fast, fast_logits = run(folder, prompts, spec=True, **params)
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


def test_a_server_with_ngram_speculation_answers_as_one_without(tmp_path):
    """The demo model repeating a function (where lookup pays): the same tokens streamed
    and not, with ``timings.draft_n`` / ``draft_n_accepted`` reported."""
    code = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n\n\n"
    body = {"prompt": code * 3 + "def area(w, h):\n", "n_predict": 48, "temperature": 0, "ignore_eos": True}
    answers = {}
    for name, extra in (
        ("plain", ()),
        ("spec", ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8")),
    ):
        with ServerProcess("-np", "2", *extra, log=tmp_path / f"{name}.log") as srv:
            srv.wait_ready()
            whole = httpx.post(srv.url + "/completion", json=body, timeout=120).json()
            with httpx.stream("POST", srv.url + "/completion", json={**body, "stream": True}, timeout=120) as r:
                frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            answers[name] = whole
            if extra:  # llama-server's per-request fields
                answers["limited"] = httpx.post(srv.url + "/completion", json={**body, "speculative.n_max": 2}).json()
                answers["off"] = httpx.post(srv.url + "/completion", json={**body, "speculative.n_min": 9}).json()
            props = httpx.get(srv.url + "/props").json()["speculative"]
            assert props["type"] == ("ngram-simple" if extra else None) and props["n_max"] == (8 if extra else 0)
            proposed = metric(srv.url, "slotserve_draft_tokens_total")
            assert (proposed > 0) == bool(extra)
            assert metric(srv.url, "slotserve_draft_tokens_accepted_total") <= proposed
            streamed = "".join(json.loads(f).get("content", "") for f in frames)
            assert streamed == whole["content"]
    assert answers["spec"]["tokens"] == answers["plain"]["tokens"]
    timings = answers["spec"]["timings"]
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert "draft_n" not in answers["plain"]["timings"]
    assert answers["limited"]["tokens"] == answers["plain"]["tokens"]  # per-request limits (llama-server's fields)
    assert answers["limited"]["timings"]["draft_n"] < timings["draft_n"]
    assert "draft_n" not in answers["off"]["timings"]  # a minimum no proposal reaches: nothing verified
