"""Anthropic's Messages API (server/routes/anthropic_api.py) through the ``anthropic`` SDK
against a real server: the same tokens as the chat completion it becomes, stop
sequences, streaming with Anthropic's event sequence, a forced tool call and its
result, token counting, x-api-key, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import pytest
from server_proc import InProcessServer

KEY = "sk-ant-test"
USER = [{"role": "user", "content": "def add(a, b):"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def srv():
    with InProcessServer(parallel=2, api_key=KEY, temp=0.0) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv):
    import anthropic  # here, not at the top: the SDK's import (~1.7 s) is paid by the worker that runs these

    return anthropic.Anthropic(base_url=srv.url, api_key=KEY)


def chat(srv, messages, **kw) -> dict:
    body = {"messages": messages, "max_tokens": 24, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": KEY}, timeout=60).json()


def test_a_message_is_the_chat_completion_it_means(srv, client):
    m = client.messages.create(model="demo", max_tokens=24, system="Be brief.", messages=USER)
    same = chat(srv, [{"role": "system", "content": "Be brief."}, *USER])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content[0].type == "text" and m.content[0].text == same["choices"][0]["message"]["content"]
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 24
    assert m.usage.input_tokens == same["usage"]["prompt_tokens"]
    counted = client.messages.count_tokens(model="demo", system="Be brief.", messages=USER)
    assert counted.input_tokens == m.usage.input_tokens


def test_a_stop_sequence_is_named(client):
    text = client.messages.create(model="demo", max_tokens=24, messages=USER).content[0].text
    stop = text.strip()[:2]
    m = client.messages.create(model="demo", max_tokens=24, messages=USER, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert (m.content[0].text if m.content else "") == text[: text.index(stop)]


def test_the_stream_has_anthropics_event_sequence(srv, client):
    whole = client.messages.create(model="demo", max_tokens=16, messages=USER)
    with client.messages.stream(model="demo", max_tokens=16, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and final.usage.output_tokens == 16 and final.stop_reason == "max_tokens"
    body = {"model": "demo", "max_tokens": 8, "messages": USER, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60) as r:
        events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "content_block_start"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_a_forced_tool_call_and_its_result(client):
    m = client.messages.create(
        model="demo", max_tokens=64, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and call.name == "get_weather" and isinstance(call.input["city"], str)
    answer = client.messages.create(
        model="demo", max_tokens=8, tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},  # noqa: E501
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
        ],
    )  # fmt: skip
    assert answer.content and answer.usage.output_tokens > 0


def test_thinking_settings_are_taken(client):
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        assert client.messages.create(model="demo", max_tokens=4, messages=USER, thinking=thinking).content


def test_errors_come_in_anthropics_shape(srv, client):
    import anthropic

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="demo", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert err.value.body["type"] == "error" and "text only" in err.value.body["error"]["message"]
    assert "image input is not supported" in err.value.body["error"]["message"]  # llama-server's words
    missing = httpx.post(srv.url + "/v1/messages", json={"messages": USER}, headers={"x-api-key": KEY})
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=srv.url, api_key="wrong").messages.create(model="d", max_tokens=4, messages=USER)
    assert err.value.body["type"] == "error"
    assert json.loads(httpx.get(srv.url + "/health").text)  # the server is well


def test_no_messages_at_all_is_taken_as_llama_server_takes_it(srv):
    r = httpx.post(srv.url + "/v1/messages", json={"max_tokens": 4, "messages": []}, headers={"x-api-key": KEY})
    assert r.status_code == 200 and r.json()["type"] == "message" and r.json()["usage"]["output_tokens"] > 0
    body = {"model": "demo", "max_tokens": 4, "messages": USER, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60) as s:
        start = next(json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: "))
    counted = httpx.post(srv.url + "/v1/messages/count_tokens", json={"messages": USER}, headers={"x-api-key": KEY})
    assert (
        start["type"] == "message_start" and start["message"]["usage"]["input_tokens"] == counted.json()["input_tokens"]
    )


def test_a_message_does_not_pay_for_llama_servers_verbose_answer(client, monkeypatch):
    """Messages go the one chat way (server/pipeline/chat.py) without ``__verbose``: the
    stop sequence comes from the run itself, so the prompt is never detokenized whole."""
    from server.pipeline import openai_run

    def refuse(*_):
        raise AssertionError("__verbose was computed for an Anthropic message")

    monkeypatch.setattr(openai_run, "verbose_answer", refuse)
    m = client.messages.create(
        model="demo", max_tokens=32, messages=[{"role": "user", "content": "Count: one two"}], stop_sequences=["e"]
    )
    assert m.stop_reason in ("stop_sequence", "max_tokens", "end_turn")
    assert m.stop_reason != "stop_sequence" or m.stop_sequence == "e"


def claude_code_system(nonce: str) -> list[dict]:
    """Claude Code's system blocks: a billing header with a new nonce on every request,
    then its system prompt."""
    header = f"x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch={nonce};"
    prompt = "You are Claude Code, a coding agent. Read files before editing them. " * 12
    return [{"type": "text", "text": header}, {"type": "text", "text": prompt}]


def test_claude_codes_billing_header_does_not_cost_the_cache(client):
    """The header does not reach the prompt, so the second turn reads all of the first
    turn's prompt from the slot's cache (a nonce in the first tokens made that 0)."""
    first = client.messages.create(model="demo", max_tokens=8, system=claude_code_system("5f1e"), messages=USER)
    plain = client.messages.count_tokens(model="demo", system=claude_code_system("5f1e")[1:], messages=USER)
    assert first.usage.input_tokens == plain.input_tokens
    turn = [*USER, {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "and sub?"}]
    second = client.messages.create(model="demo", max_tokens=8, system=claude_code_system("a9c2"), messages=turn)
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens - 1, (first.usage, second.usage)
