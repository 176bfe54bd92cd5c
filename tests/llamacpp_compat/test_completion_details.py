"""llama-server's /completion details: a list of prompts is a batch answered with a
list, mixed and JSON-object prompts, logit_bias in its three spellings, per-token bytes,
response_fields, generation_settings, timings_per_token, return_progress, truncated."""

from __future__ import annotations

import json

import httpx
import pytest
from server_proc import InProcessServer

GREEDY = {"temperature": 0, "n_predict": 8}


def post(srv, **body) -> httpx.Response:
    return httpx.post(srv.url + "/completion", json={**GREEDY, **body}, timeout=120)


def frames(srv, **body) -> list[dict]:
    with httpx.stream("POST", srv.url + "/completion", json={**GREEDY, **body, "stream": True}, timeout=120) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_list_of_prompts_is_a_batch_answered_with_a_list(demo_server):
    prompts = ["def add(a, b):", "import os\n", "class Stack:"]
    alone = [post(demo_server, prompt=p).json()["content"] for p in prompts]
    batch = post(demo_server, prompt=prompts).json()
    assert isinstance(batch, list) and [b["index"] for b in batch] == [0, 1, 2]
    assert [b["content"] for b in batch] == alone
    streamed = frames(demo_server, prompt=prompts[:2])
    for i in (0, 1):
        mine = [f for f in streamed if f["index"] == i]
        assert "".join(f["content"] for f in mine) == alone[i] and mine[-1]["stop"] is True


def test_mixed_and_object_prompts_are_the_same_prompt(demo_server):
    ids = httpx.post(demo_server.url + "/tokenize", json={"content": "def main():"}).json()["tokens"]
    text = post(demo_server, prompt="def main():").json()
    assert post(demo_server, prompt={"prompt_string": "def main():"}).json()["content"] == text["content"]
    head = httpx.post(demo_server.url + "/tokenize", json={"content": "def"}).json()["tokens"]
    mixed = post(demo_server, prompt=[*head, " main():"]).json()
    assert mixed["tokens_evaluated"] == len(ids) and mixed["content"] == text["content"]
    assert post(demo_server, prompt={"prompt_string": "x", "multimodal_data": ["aGk="]}).status_code == 400


def test_logit_bias_by_id_by_text_and_as_an_object(demo_server):
    plain = post(demo_server, prompt="import os\n", n_probs=1).json()
    first = plain["tokens"][0]
    piece = plain["completion_probabilities"][0]["token"]
    for bias in ([[first, False]], [[piece, False]], {piece: -100}, {str(first): False}):
        out = post(demo_server, prompt="import os\n", logit_bias=bias).json()
        assert out["tokens"][0] != first, bias
    forced = post(demo_server, prompt="import os\n", logit_bias=[[7, 100]], n_predict=3).json()
    assert forced["tokens"] == [7, 7, 7]
    assert post(demo_server, prompt="x", logit_bias=[[10**6, 1]]).status_code == 400


def test_token_bytes_rebuild_the_text_and_response_fields_select(demo_server):
    out = post(demo_server, prompt="# héllo wörld 日本\n", n_probs=2, n_predict=24).json()
    probs = out["completion_probabilities"]
    assert bytes(b for p in probs for b in p["bytes"]).decode("utf-8") == out["content"]
    assert all("bytes" in t for p in probs for t in p["top_logprobs"])
    picked = post(demo_server, prompt="x", response_fields=["content", "generation_settings/n_predict", "nope"]).json()
    assert set(picked) == {"content", "generation_settings/n_predict"} and picked["generation_settings/n_predict"] == 8


def test_generation_settings_show_the_bias_and_ignore_eos(demo_server):
    settings = post(demo_server, prompt="x", logit_bias={"5": 2.5, "6": False}, ignore_eos=True).json()
    bias = {t: b for t, b in settings["generation_settings"]["logit_bias"]}
    eos = httpx.get(demo_server.url + "/props").json()["eos_token"]
    eos_id = httpx.post(demo_server.url + "/tokenize", json={"content": eos, "add_special": True}).json()["tokens"]
    assert bias[5] == 2.5 and bias[6] is False and all(bias.get(t) is False for t in eos_id)
    assert settings["generation_settings"]["temperature"] == 0


def test_timings_per_token_and_prompt_progress(demo_server):
    prompt = "x = [1, 2, 3]\n" * 80  # several steps of 512 tokens
    first = frames(demo_server, prompt=prompt, return_progress=True, timings_per_token=True, id_slot=2)
    progress = [f["prompt_progress"] for f in first if "prompt_progress" in f]
    assert len(progress) >= 2 and progress[-1]["processed"] == progress[-1]["total"]
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    tokens = [f for f in first if "prompt_progress" not in f and not f["stop"]]
    assert tokens and all("timings" in f for f in tokens)
    again = frames(demo_server, prompt=prompt, return_progress=True, id_slot=2)
    assert [f["prompt_progress"] for f in again if "prompt_progress" in f][0]["cache"] > progress[0]["cache"]
    assert all("timings" not in f for f in again if not f["stop"])


@pytest.fixture(scope="module")
def shifting():
    with InProcessServer(parallel=1, ctx_size=128, context_shift=True) as server:
        yield server


def test_truncated_after_a_context_shift(shifting, demo_server):
    out = post(shifting, prompt="def f():", n_predict=200, ignore_eos=True).json()
    assert out["tokens_predicted"] == 200 and out["truncated"] is True
    assert post(demo_server, prompt="def f():", n_predict=20, ignore_eos=True).json()["truncated"] is False


def test_n_indent_and_t_max_predict_ms_are_taken(demo_server):
    """A line indented less than ``n_indent`` ends the answer (tests/test_output_limits.py
    checks where); the fields are validated as llama-server bounds them."""
    body = {"prompt": "def fibonacci(n):", "n_predict": 40, "ignore_eos": True}
    plain = post(demo_server, **body).json()
    first, _, rest = plain["content"].partition("\n")
    pad = len(rest) - len(rest.lstrip(" "))
    assert pad > 0
    cut = post(demo_server, **body, n_indent=pad + 1).json()
    assert cut["content"] == first + "\n" + " " * pad and cut["stop_type"] == "limit"
    assert post(demo_server, **body, t_max_predict_ms=60_000).json()["content"] == plain["content"]
    for field, value in (("n_indent", -1), ("t_max_predict_ms", -2)):
        bad = post(demo_server, **body, **{field: value})
        assert bad.status_code == 400 and field in bad.json()["error"]["message"]


def test_n_cmpl_completes_each_prompt_that_many_times(demo_server):
    """llama-server's child tasks: prompt by prompt, its completions in a row; a child's
    seed is the request's moved by its number."""
    sampled = {"prompt": ["def add(a, b):", "import os\n"], "temperature": 1.0, "seed": 40}
    answers = post(demo_server, **sampled, n_cmpl=2).json()
    assert [a["index"] for a in answers] == [0, 1, 2, 3]
    for i, (prompt, child) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        alone = post(demo_server, **{**sampled, "prompt": sampled["prompt"][prompt], "seed": 40 + child}).json()
        assert answers[i]["content"] == alone["content"], i
    assert [a["content"] for a in post(demo_server, **sampled, n=2).json()] == [a["content"] for a in answers]
    streamed = frames(demo_server, **sampled, n_cmpl=2)
    for i in range(4):
        mine = [f for f in streamed if f["index"] == i]
        assert "".join(f["content"] for f in mine) == answers[i]["content"] and mine[-1]["stop"] is True
    too_many = post(demo_server, prompt="x", n_cmpl=5)
    assert too_many.status_code == 400 and "n_cmpl" in too_many.json()["error"]["message"]
