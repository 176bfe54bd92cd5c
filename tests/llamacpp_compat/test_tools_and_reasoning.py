"""Tool calls, built-in chat templates and the reasoning split, through the openai
client and raw HTTP, as llama-server's chat tests exercise them."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_proc import InProcessServer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "maximum": 99, "minimum": 0}, "b": {"type": "integer", "maximum": 9}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Sum two numbers", "parameters": ADD}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


@pytest.fixture(scope="module", params=["model", "chatml"])
def srv(request, demo_server):
    """The demo model's own template (no tools in it: they go in a system turn) and the
    built-in ChatML one (Hermes tools), with --reasoning-format none and
    --no-prefill-assistant on the latter."""
    if request.param == "model":
        yield demo_server
        return
    with InProcessServer(
        parallel=2, chat_template="chatml", reasoning_format="none", prefill_assistant=False
    ) as server:
        yield server


@pytest.fixture
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none")


def _check(call, schemas: dict) -> None:
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_required_and_named_tool_choice_always_give_a_valid_call(client):
    schemas = {"get_weather": WEATHER, "add": ADD}
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", n=2, seed=5, temperature=1.0, max_tokens=80
    )
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _check(choice.message.tool_calls[0], schemas)
    named = {"type": "function", "function": {"name": "add"}}
    out = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=80)
    assert out.choices[0].message.tool_calls[0].function.name == "add"
    _check(out.choices[0].message.tool_calls[0], schemas)


def test_a_streamed_call_arrives_as_openai_streams_it(client):
    stream = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, stream=True, seed=2
    )
    chunks = list(stream)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].function.name in ("get_weather", "add")
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER if calls[0].function.name != "add" else ADD)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_an_auto_answer_is_parsed_for_calls_and_results_render_back(srv, client):
    grammar = "root ::= " + json.dumps(CALL_TEXT)  # the model "decides" to call
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, max_tokens=60, extra_body={"grammar": grammar}
    )
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_weather"
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Paris", "days": 3}
    plain = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=60, extra_body={"grammar": grammar}
    )
    assert plain.choices[0].message.content == CALL_TEXT and not plain.choices[0].message.tool_calls
    turns = [*ASK, message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "x", "content": "18C"}]
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": turns, "tools": TOOLS}).json()["prompt"]
    assert '"name": "get_weather"' in prompt and "<tool_response>\n18C\n</tool_response>" in prompt
    assert '"description": "Forecast"' in prompt
    follow = client.chat.completions.create(model="m", messages=turns, tools=TOOLS, max_tokens=4)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_without_tools_or_an_unknown_name_is_a_400(srv):
    base = {"messages": ASK, "max_tokens": 4}
    for extra in (
        {"tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
    ):
        r = httpx.post(srv.url + "/v1/chat/completions", json={**base, **extra}, timeout=60)
        assert r.status_code == 400, extra


THOUGHT = 'root ::= "I add 2 and 2.</think>\\n\\nIt is 4."'


def _reasoning_request(srv, stream: bool, **extra):
    body = {
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\n"}],
        "grammar": THOUGHT,
        "max_tokens": 40,
        "stream": stream,
        **extra,
    }
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def test_reasoning_is_split_whole_and_streamed(demo_server):
    whole = _reasoning_request(demo_server, False).json()["choices"][0]["message"]
    assert whole["reasoning_content"] == "I add 2 and 2." and whole["content"] == "It is 4."
    frames = [
        json.loads(line[6:])["choices"][0]["delta"]
        for line in _reasoning_request(demo_server, True).text.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(f.get("reasoning_content") or "" for f in frames).strip() == "I add 2 and 2."
    assert "".join(f.get("content") or "" for f in frames) == "It is 4."
    kept = _reasoning_request(demo_server, False, reasoning_format="none").json()["choices"][0]["message"]
    assert kept["content"] == "I add 2 and 2.</think>\n\nIt is 4." and "reasoning_content" not in kept


def test_the_server_wide_reasoning_format_and_a_request_override(srv):
    server_splits = srv.state.settings.reasoning_format != "none"
    default = _reasoning_request(srv, False).json()["choices"][0]["message"]
    assert ("</think>" in default["content"]) != server_splits
    other = "none" if server_splits else "deepseek"
    override = _reasoning_request(srv, False, reasoning_format=other).json()["choices"][0]["message"]
    assert ("reasoning_content" in override) != server_splits


def test_built_in_templates_props_and_template_variables(srv):
    props = httpx.get(srv.url + "/props").json()
    expected = "chatml" if srv.state.settings.chat_template else "model"
    assert props["chat_template_name"] == expected and props["chat_template"]
    body = {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}
    prompt = httpx.post(srv.url + "/apply-template", json=body).json()["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n") == (expected == "chatml")


def test_named_templates_render_their_family(tmp_path):
    from engine.text.chat_template import ChatTemplate, builtin_names, resolve_template
    from engine.text.llama_formats import FormattedTemplate

    markers = {"llama3": "<|start_header_id|>", "mistral": "[INST]", "gemma": "<start_of_turn>", "phi3": "<|user|>"}
    for name, marker in markers.items():
        name, source = resolve_template(name)
        assert marker in (FormattedTemplate(name) if source is None else ChatTemplate(source, {})).render(ASK)
    assert {"chatml", "llama3", "mistral-v7", "gemma", "deepseek-r1"} <= set(builtin_names())
    with pytest.raises(ValueError, match="unknown chat template"):
        resolve_template("chatmll")
    custom = tmp_path / "t.jinja"
    custom.write_text("{% for m in messages %}<<{{ m.content }}>>{% endfor %}")
    with InProcessServer(parallel=1, chat_template_file=custom) as server:
        prompt = httpx.post(server.url + "/apply-template", json={"messages": ASK}).json()["prompt"]
        assert prompt == f"<<{ASK[0]['content']}>>"
        assert httpx.get(server.url + "/props").json()["chat_template_name"] == "custom"


def test_no_prefill_assistant_closes_a_final_assistant_message(srv):
    turns = [*ASK, {"role": "assistant", "content": "Let me"}]
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": turns}).json()["prompt"]
    continued = httpx.post(srv.url + "/apply-template", json={"messages": turns, "continue_final_message": True})
    assert continued.json()["prompt"].endswith("Let me")
    assert prompt.endswith("Let me") != (srv.state.settings.prefill_assistant is False)
