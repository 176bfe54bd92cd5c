"""Tool calls in chat completions, in each template family's own syntax (which family a
chat template is: server/pipeline/template_family.py): the calls found in the model's
text, whole or streamed (``parse``, ``ToolCallStream``), and the grammar that forces a
call when ``tool_choice`` requires one (``forced_grammar``). The families and their
syntax: ``families.FAMILIES``."""

from __future__ import annotations

import functools
import json
import re

from server.pipeline.tool_calls.call import ToolCall, param_schemas
from server.pipeline.tool_calls.families import BY_NAME, FAMILIES
from server.pipeline.tool_calls.stream import ToolCallStream, parse

__all__ = [
    "FAMILIES",
    "ToolCall",
    "ToolCallStream",
    "forced_grammar",
    "marker_text",
    "param_schemas",
    "parse",
]
LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
SAMPLE = {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}, "required": ["s", "n"]}


@functools.cache
def marker_text(fmt: str) -> str:
    """Every marker the family writes around and inside its calls, as one text (its
    grammar's literals for a sample tool, and its openings and closings)."""
    syntax = BY_NAME[fmt]
    grammar = syntax.grammar([{"type": "function", "function": {"name": "f", "parameters": SAMPLE}}], True)
    literals = []
    for found in LITERAL.findall(grammar):  # (a quote inside one of the grammar's regexes opens no literal)
        try:
            literals.append(json.loads(found))
        except ValueError:
            continue
    return "".join(literals + [m for pair in syntax.pairs for m in pair if m])


def forced_grammar(fmt: str, tools: list[dict], parallel: bool) -> str:
    """A Lark grammar (llguidance) whose every sentence is a well-formed call of one of
    ``tools`` in the family's syntax (parallel: one or more)."""
    return BY_NAME[fmt].grammar(tools, parallel)


def tools_system_prompt(tools: list[dict]) -> str:
    """The Hermes tool instructions, for a template that does not render tools itself."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )
