"""OpenAI's Responses API (server/routes/responses_api.py) through the ``openai`` SDK's
``responses.create`` against a real server: the same tokens as the chat completion the
request becomes (string and item inputs, instructions, tool calls and their outputs),
the event sequence of a stream, function tools, ``text.format`` json_schema, reasoning
items, llama-server's telemetry fields, token counting, and its 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

ASK = "What is the weather in Paris for 3 days?"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "Forecast", "parameters": WEATHER}


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="none")


def chat(srv, messages, **kw) -> dict:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()


def test_a_response_is_the_chat_completion_it_means(demo_server, client):
    r = client.responses.create(model="m", instructions="Be brief.", input="def add(a, b):", max_output_tokens=12,
                                temperature=0)  # fmt: skip
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]
    same = chat(demo_server, messages)
    assert r.id.startswith("resp_") and r.object == "response" and r.output[0].id.startswith("msg_")
    assert r.output_text == same["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == same["usage"]["prompt_tokens"] and r.usage.output_tokens == 12
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    counted = client.responses.input_tokens.count(model="m", instructions="Be brief.", input="def add(a, b):")
    assert counted.input_tokens == r.usage.input_tokens


def test_item_inputs_are_the_conversation_they_stand_for(demo_server, client):
    items = [
        {"role": "developer", "content": "You forecast."},
        {"role": "user", "content": [{"type": "input_text", "text": ASK}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
    ]
    r = client.responses.create(model="m", input=items, tools=[TOOL], max_output_tokens=12, temperature=0)
    messages = [
        {"role": "developer", "content": "You forecast."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    same = chat(demo_server, messages, tools=tools)
    assert r.usage.input_tokens == same["usage"]["prompt_tokens"]
    assert r.output_text == (same["choices"][0]["message"]["content"] or "")


def test_the_stream_has_the_responses_event_sequence(client):
    kw = {"model": "m", "input": "def add(a, b):", "max_output_tokens": 10, "temperature": 0}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    msg_id = events[2].item.id
    assert all(e.item_id == msg_id for e in events if hasattr(e, "item_id"))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == whole.output_text == final.output_text and final.output[0].id == msg_id
    assert final.usage.output_tokens == 10 and final.id == events[0].response.id


def test_a_required_function_call_is_an_item_whole_and_streamed(client):
    kw = {"model": "m", "input": ASK, "tools": [TOOL], "tool_choice": "required", "max_output_tokens": 80,
          "parallel_tool_calls": False}  # fmt: skip
    r = client.responses.create(**kw, temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.id.startswith("fc_") and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = list(client.responses.create(**kw, temperature=0, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == 1 and added[0].item.type == "function_call" and added[0].item.name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == done.arguments == call.arguments and done.item_id == added[0].item.id
    assert events[-1].response.output[0].arguments == call.arguments


def test_text_format_json_schema_constrains_the_output(client):
    days = {"type": "integer", "minimum": 1, "maximum": 7}
    bounded = {**WEATHER, "properties": {**WEATHER["properties"], "days": days}}
    fmt = {"type": "json_schema", "name": "forecast", "schema": bounded, "strict": True}
    for seed in (1, 2, 3):  # sampled, seeded: the same answers every run, each valid JSON of the schema
        r = client.responses.create(model="m", input=ASK, text={"format": fmt}, max_output_tokens=120, temperature=0.7,
                                    extra_body={"seed": seed})  # fmt: skip
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), bounded)
    assert r.text.format.type == "json_schema"


THOUGHT = 'root ::= "I add 2 and 2.</think>\\n\\nIt is 4."'
THINKING = [{"role": "user", "content": "2+2?"}, {"type": "message", "role": "assistant", "content": "<think>\n"}]


def test_reasoning_is_an_item_before_the_message(client):
    r = client.responses.create(model="m", input=THINKING, max_output_tokens=40, extra_body={"grammar": THOUGHT})
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "I add 2 and 2." and r.output_text == "It is 4."
    events = list(client.responses.create(model="m", input=THINKING, max_output_tokens=40, stream=True,
                                          extra_body={"grammar": THOUGHT}))  # fmt: skip
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought.strip() == "I add 2 and 2."
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"] and events[-1].response.output_text.strip() == "It is 4."


def test_llama_server_telemetry_rides_on_the_events(demo_server):
    # greedy: a sampled answer may be 6 tokens with no text (bytes of an unfinished character), and no delta
    body = {"input": "This is a test " * 40, "max_output_tokens": 6, "stream": True, "timings_per_token": True,
            "return_progress": True, "cache_prompt": False, "temperature": 0}  # fmt: skip
    with httpx.stream("POST", demo_server.url + "/responses", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    assert any("timings" in e for e in events if e["type"] == "response.output_text.delta")
    assert events[-1]["type"] == "response.completed" and events[-1]["timings"]["predicted_n"] == 6
    assert events[-1]["response"]["usage"]["output_tokens"] == 6


@pytest.mark.parametrize(
    "body, says",
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
        ({"instructions": "x"}, "input"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input"),
    ],
)
def test_refused_requests_are_400s_in_openai_shape(demo_server, body, says):
    r = httpx.post(demo_server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert says in r.json()["error"]["message"]
    assert httpx.get(demo_server.url + "/health").status_code == 200
