"""Structured outputs over HTTP, as llama-server, OpenAI and vLLM clients ask for them:
``json_schema`` and ``grammar`` on /completion, ``response_format`` through the openai
client, vLLM's ``structured_outputs``; every output parses; a constraint that does not
compile is a 400 naming the problem that leaves the slot as it was."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

ITEM = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "count": {"type": "integer", "minimum": 1, "maximum": 50},
        "kind": {"enum": ["book", "tool", "food"]},
    },
    "required": ["title", "count", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="none")


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_response_format_json_schema_through_the_openai_client(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM, "strict": True}}
    for seed in (1, 2):
        out = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "An item, as JSON"}],
            response_format=fmt,
            n=4,
            temperature=1.0,
            seed=seed,
            max_tokens=80,
        )
        for choice in out.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), ITEM)


def test_response_format_json_object_and_llama_servers_schema_beside_it(client):
    anything = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "JSON please"}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0.8,
        seed=3,
    )
    assert anything.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(anything.choices[0].message.content), dict)
    fmt = {"type": "json_object", "schema": ITEM}
    bounded = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], response_format=fmt, max_tokens=80, seed=4
    )
    jsonschema.validate(json.loads(bounded.choices[0].message.content), ITEM)


def test_native_completion_takes_json_schema_and_a_streamed_gbnf_grammar(demo_server):
    for seed in range(3):
        out = post(demo_server, "/completion", prompt="Item:", json_schema=ITEM, n_predict=80, seed=seed).json()
        jsonschema.validate(json.loads(out["content"]), ITEM)
    grammar = 'root ::= "answer: " [0-9]{2,3} " " ("apples" | "pears")'
    body = {"prompt": "Q: how many?\n", "grammar": grammar, "n_predict": 30, "stream": True, "seed": 9}
    with httpx.stream("POST", demo_server.url + "/completion", json=body, timeout=120) as r:
        frames = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert len(frames) > 2
    assert re.fullmatch(r"answer: [0-9]{2,3} (apples|pears)", "".join(f["content"] for f in frames))


def test_vllm_structured_outputs_regex_and_choice(demo_server):
    regex = post(
        demo_server,
        "/v1/completions",
        prompt="Code:",
        structured_outputs={"regex": r"[A-Z]{3}-[0-9]{4}"},
        max_tokens=20,
    )
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", regex.json()["choices"][0]["text"])
    choices = ["red", "green", "blue"]
    picked = post(demo_server, "/v1/completions", prompt="Color:", guided_choice=choices, max_tokens=10, n=3, seed=2)
    assert {c["text"] for c in picked.json()["choices"]} <= set(choices)


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("grammar", "root ::= missing", "grammar"),
        ("json_schema", {"type": "banana"}, "json_schema"),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
        ("structured_outputs", {"regex": "(unclosed"}, "regex"),
    ],
)
def test_a_bad_constraint_is_a_400_that_leaves_the_slot_alone(demo_server, field, value, named):
    warm = post(demo_server, "/completion", prompt="def main():", n_predict=4, id_slot=3, temperature=0)
    assert warm.status_code == 200
    before = httpx.get(demo_server.url + "/slots").json()[3]
    bad = post(demo_server, "/completion", prompt="something else", n_predict=4, id_slot=3, **{field: value})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error" and named in error["message"]
    assert httpx.get(demo_server.url + "/slots").json()[3] == before


def test_two_constraints_at_once_are_refused(demo_server):
    bad = post(demo_server, "/completion", prompt="x", grammar='root ::= "a"', json_schema={"type": "object"})
    assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]
