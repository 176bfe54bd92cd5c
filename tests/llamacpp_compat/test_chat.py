"""Chat details llama-server (and OpenAI) clients rely on: the role-only first stream
chunk, system_fingerprint, assistant prefill and vLLM's continue_final_message, the
refusals of malformed conversations, and token counting of a chat request."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "Write a function"}]


@pytest.fixture(scope="module")
def srv(demo_server):
    return demo_server


def chat(srv, messages, **kw) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def test_a_stream_opens_with_the_role_and_no_content(srv):
    body = {"messages": USER, "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        frames = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in f["choices"][0]["delta"] for f in frames[1:])
    assert (
        "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
        == chat(srv, USER, max_tokens=6).json()["choices"][0]["message"]["content"]
    )
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=6, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None


def test_every_answer_names_its_system_fingerprint(srv):
    first, second = chat(srv, USER).json(), chat(srv, USER).json()
    completion = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60).json()
    assert first["system_fingerprint"].startswith("slotserve-")
    assert first["system_fingerprint"] == second["system_fingerprint"] == completion["system_fingerprint"]


def test_a_final_assistant_message_is_continued(srv):
    prefix = "def fibonacci(n):"
    prefilled = chat(srv, [*USER, {"role": "assistant", "content": prefix}]).json()["choices"][0]["message"]["content"]
    opened = httpx.post(srv.url + "/apply-template", json={"messages": USER}).json()["prompt"]
    raw = httpx.post(srv.url + "/completion", json={"prompt": opened + prefix, "n_predict": 12, "temperature": 0})
    assert prefilled == raw.json()["content"]  # the prompt ended inside the assistant's turn
    closed = chat(srv, [*USER, {"role": "assistant", "content": prefix}], continue_final_message=False)
    assert closed.status_code == 200 and closed.json()["choices"][0]["message"]["content"] != prefilled
    vllm = chat(
        srv, [*USER, {"role": "assistant", "content": prefix}], continue_final_message=True, add_generation_prompt=False
    )
    assert vllm.json()["choices"][0]["message"]["content"] == prefilled


@pytest.mark.parametrize(
    "messages,extra,needle",
    [
        ([*USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], {}, "two assistant"),
        (
            [*USER, {"role": "assistant", "content": "a"}],
            {"continue_final_message": True, "add_generation_prompt": True},
            "both",
        ),
        (USER, {"continue_final_message": True}, "last message"),
    ],
)
def test_malformed_conversations_are_400(srv, messages, extra, needle):
    r = chat(srv, messages, **extra)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_input_tokens_counts_the_rendered_prompt(srv):
    r = httpx.post(srv.url + "/v1/chat/completions/input_tokens", json={"messages": USER})
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": USER}).json()["prompt"]
    n = len(httpx.post(srv.url + "/tokenize", json={"content": prompt}).json()["tokens"])
    assert r.status_code == 200 and r.json() == {"object": "response.input_tokens", "input_tokens": n}
