"""The reasoning budget over HTTP (llama-server's ``--reasoning-budget``,
``--reasoning-budget-message``, a request's ``reasoning_budget_tokens`` /
``thinking_budget_tokens`` / ``reasoning_budget_message``, Anthropic's
``thinking.budget_tokens``): the demo model never closes a thought by itself; with a
budget the thought is closed after that many tokens and the answer follows."""

from __future__ import annotations

import httpx
from server_proc import InProcessServer

OPEN = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\n"}]  # a thought opened


def chat(srv, **extra) -> dict:
    body = {"messages": OPEN, "max_tokens": 24, "temperature": 0, **extra}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_a_budget_closes_the_thought_and_the_answer_follows(demo_server):
    free = chat(demo_server)
    assert free["reasoning_content"] and not free.get("content")  # thinks to the end
    short = chat(demo_server, reasoning_budget_tokens=4)
    assert short["content"] and free["reasoning_content"].startswith(short["reasoning_content"])
    assert len(short["reasoning_content"]) < len(free["reasoning_content"])
    assert chat(demo_server, thinking_budget_tokens=4) == short  # llama-server's other name
    said = chat(demo_server, reasoning_budget_tokens=4, reasoning_budget_message=" Time is up.")
    assert said["reasoning_content"].startswith(short["reasoning_content"]) and said["reasoning_content"].endswith(
        " Time is up."
    )
    assert said["content"]  # the answer follows the message
    assert chat(demo_server, reasoning_budget_tokens=-1) == free  # -1: the server's (free)
    bad = httpx.post(demo_server.url + "/v1/chat/completions", json={"messages": OPEN, "reasoning_budget_tokens": -2})
    assert bad.status_code == 400 and "reasoning_budget_tokens" in bad.json()["error"]["message"]


def test_anthropic_thinking_budget_and_the_server_flag(demo_server):
    short = chat(demo_server, reasoning_budget_tokens=4)
    body = {"model": "x", "max_tokens": 24, "temperature": 0, "messages": OPEN}
    thought = {"type": "enabled", "budget_tokens": 4}
    blocks = httpx.post(demo_server.url + "/v1/messages", json={**body, "thinking": thought}, timeout=60).json()
    thinking = [b["thinking"] for b in blocks["content"] if b["type"] == "thinking"]
    assert thinking == [short["reasoning_content"]]
    said = chat(demo_server, reasoning_budget_tokens=4, reasoning_budget_message=" Time is up.")
    with InProcessServer(reasoning_budget=4, reasoning_budget_message=" Time is up.") as srv:
        assert chat(srv) == said  # the server's budget and message for requests that give none
        assert chat(srv, reasoning_budget_tokens=4, reasoning_budget_message="") == short
