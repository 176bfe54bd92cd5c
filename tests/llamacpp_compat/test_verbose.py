"""``__verbose`` in OpenAI answers, as llama-server adds it with ``-v`` (or a request's
``verbose``): its native answer for the request, with the prompt as rendered."""

from __future__ import annotations

import json

import httpx
from server_proc import InProcessServer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]


def test_a_verbose_server_adds_the_native_answer_with_the_prompt():
    with InProcessServer(verbose=True, parallel=1) as srv:
        body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0}
        answer = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
        rendered = httpx.post(srv.url + "/apply-template", json={"messages": MESSAGES}).json()["prompt"]
        verbose = answer["__verbose"]
        assert verbose["prompt"].endswith(rendered)  # the template's text, special tokens written out
        assert verbose["content"] == answer["choices"][0]["message"]["content"]
        assert verbose["tokens_predicted"] == answer["usage"]["completion_tokens"] == len(verbose["tokens"])
        assert verbose["tokens_evaluated"] == answer["usage"]["prompt_tokens"]
        assert verbose["generation_settings"]["temperature"] == 0
        plain = {"prompt": "import os\n", "max_tokens": 4, "temperature": 0}
        completion = httpx.post(srv.url + "/v1/completions", json=plain, timeout=60).json()
        assert completion["__verbose"]["prompt"].endswith("import os\n")
        assert completion["__verbose"]["content"] == completion["choices"][0]["text"]
        quiet = httpx.post(srv.url + "/v1/completions", json={**plain, "verbose": False}, timeout=60).json()
        assert "__verbose" not in quiet


def test_a_request_asks_for_it_on_a_quiet_server(demo_server):
    plain = {"prompt": "import os\n", "max_tokens": 4, "temperature": 0}
    assert "__verbose" not in httpx.post(demo_server.url + "/v1/completions", json=plain, timeout=60).json()
    loud = httpx.post(demo_server.url + "/v1/completions", json={**plain, "verbose": True}, timeout=60).json()
    assert loud["__verbose"]["tokens"] and loud["__verbose"]["stop_type"] in ("limit", "eos", "word")


def test_a_stream_carries_it_on_its_finishing_chunk(demo_server):
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True, "verbose": True}
    with httpx.stream("POST", demo_server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    carrying = [c for c in chunks if "__verbose" in c]
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] is not None
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert carrying[0]["__verbose"]["content"] == text and carrying[0]["__verbose"]["prompt"]
    quiet = {**body, "verbose": False}
    with httpx.stream("POST", demo_server.url + "/v1/chat/completions", json=quiet, timeout=60) as r:
        assert not any("__verbose" in line for line in r.iter_lines())
