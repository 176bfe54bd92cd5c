"""A tool call as OpenAI sends it, and how a family's written values become its JSON
arguments (by the request's tool schemas where the text alone cannot say)."""

from __future__ import annotations

import ast
import json
import uuid
from dataclasses import dataclass


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


Schemas = dict[str, dict[str, dict]]  # {tool name: {parameter: its JSON schema}}


def tool_names(tools: list[dict] | None) -> frozenset[str] | None:
    """The names of the request's tools; None when it sent none (no name to check)."""
    if not tools:
        return None
    return frozenset(str((t.get("function") or {}).get("name", "")) for t in tools if isinstance(t, dict))


def param_schemas(tools: list[dict] | None) -> Schemas:
    """Each tool's parameters' schemas, from the request's ``tools``."""
    out: Schemas = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k: v for k, v in props.items() if isinstance(v, dict)}
    return out


def make(name: str, args: object, call_id: str = "") -> ToolCall | None:
    """A call of ``name`` with ``args`` (a mapping, or a JSON object as text); None when
    either is not what a call takes."""
    if isinstance(args, str):
        args = loads(args) if args.strip() else {}
    if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
        return None
    try:  # a value JSON cannot carry (bytes, a set, NaN, an int of 4,300 digits...): not a call
        arguments = json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None
    return ToolCall(name.strip(), arguments, call_id)


def from_object(obj: object) -> ToolCall | None:
    """A call written as a JSON object: ``{"name", "arguments"}`` (Hermes, Mistral,
    Apriel, Nemotron), ``{"name", "parameters"}`` (Llama 3), ``{"tool_name",
    "parameters"}`` (Command R), ``{"function": {...}}``, or ``{NAME: {arguments}}``
    (Apertus)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        return from_object({**obj["function"], "id": obj.get("id")})
    name = obj.get("name", obj.get("tool_name"))
    if name is None and len(obj) == 1:
        ((name, args),) = obj.items()
        return make(name, args) if isinstance(args, dict) else None
    args = obj.get("arguments", obj.get("parameters", {}))
    return make(name, args, str(obj.get("id") or obj.get("tool_call_id") or ""))


def loads(text: str) -> object:
    """JSON ``text``'s value, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # (an integer of more than 4,300 digits is a ValueError too)
        return None


def literal(text: str) -> tuple[bool, object]:
    """(True, value) for JSON or a Python literal (what templates print through jinja:
    ``True``, ``['a']``, ``{'k': 1}``); (False, None) otherwise."""
    text = text.strip()
    value = loads(text)
    if value is not None or text == "null":
        return True, value
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def typed(text: str, schema: dict | None) -> object:
    """A value written as text (a string as it is, anything else as JSON or as jinja
    prints it) read by its schema's type; a value of no known type is JSON if it reads
    as such, else the text."""
    kind = (schema or {}).get("type")
    if kind == "string":
        return text
    if kind == "boolean" and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    ok, value = literal(text)
    if ok and not (kind is None and isinstance(value, (set, tuple, bytes, complex))):
        return list(value) if isinstance(value, (set, tuple)) else value
    return text
