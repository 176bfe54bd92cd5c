"""Structured outputs in the engine: every sampled output of a constrained sequence
parses against its schema or grammar, whatever the seed; unconstrained rows of the
same batch are untouched; a constraint that does not compile is a RequestError."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import DEMO_MODEL, Engine, SamplingParams
from engine.errors import RequestError

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
    "additionalProperties": False,
}
POINTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "maximum": 999},
            "y": {"type": "integer", "minimum": -9, "maximum": 99},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 4,
}


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(str(DEMO_MODEL), n_seq_max=16, n_ctx=16 * 256)


@pytest.mark.parametrize("schema", [PERSON, POINTS], ids=["object", "array"])
def test_sampled_outputs_always_parse_against_the_schema(engine, schema):
    constraint = engine.grammars.compile("json_schema", schema)
    params = [SamplingParams(max_tokens=120, temperature=1.2, seed=seed, constraint=constraint) for seed in range(16)]
    for out in engine.generate(["Here is the data:\n"] * 16, params):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


def test_a_gbnf_grammar_and_a_regex_hold_for_every_seed(engine):
    gbnf = 'root ::= ("yes" | "no") ", because " [a-z ]{1,24} "."'
    pattern = r"(yes|no), because [a-z ]{1,24}\."
    grammars = [engine.grammars.compile("gbnf", gbnf), engine.grammars.compile("regex", r"[0-9]{3}-[A-Z]{2,4}")]
    params = [SamplingParams(max_tokens=60, temperature=1.0, seed=s, constraint=grammars[s % 2]) for s in range(12)]
    for seed, out in enumerate(engine.generate(["Q: is it so?\nA: "] * 12, params)):
        assert re.fullmatch(pattern if seed % 2 == 0 else r"[0-9]{3}-[A-Z]{2,4}", out.text), out.text


def test_unconstrained_rows_of_a_mixed_batch_are_untouched(engine):
    prompts = ["def add(a, b):", "import os\n", "class Stack:"]
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    alone = engine.generate(prompts, greedy)
    constraint = engine.grammars.compile("json_schema", PERSON)
    mixed = engine.generate(
        prompts + ["{"] * 5,
        [greedy] * 3 + [SamplingParams(max_tokens=80, seed=s, constraint=constraint) for s in range(5)],
    )
    assert [g.token_ids for g in mixed[:3]] == [g.token_ids for g in alone]
    assert [g.text for g in alone] != [g.text for g in mixed[3:6]]


@pytest.mark.parametrize(
    "kind, source, names",
    [
        ("gbnf", "root ::= item\n", "item"),
        ("gbnf", 'root ::= ("a" ', "grammar"),
        ("json_schema", '{"type": 7}', "type"),
        ("json_schema", "[1, 2]", "object"),
        ("regex", "[a-", "regex"),
        ("choice", "[]", "choice"),
    ],
)
def test_a_constraint_that_does_not_compile_names_the_problem(engine, kind, source, names):
    with pytest.raises(RequestError) as err:
        engine.grammars.compile(kind, source)
    assert names in str(err.value)
