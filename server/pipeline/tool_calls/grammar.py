"""Grammars (Lark, for llguidance) whose every sentence is a well-formed call in a
family's own syntax: what ``tool_choice`` "required" or a named function samples under.

Three builders cover the families:
- ``objects``: calls as JSON objects (one per envelope, a JSON list, one per line);
- ``named``: a function's name in the family's markers, then its arguments as JSON;
- ``keyed``: one element per argument (XML-like tags, key/value pairs): a string value
  is one of its enum or text without ``<``; any other a JSON value of its schema.

A builder's product: ``build(tools: list[dict], parallel: bool) -> str``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from engine import JSON_OPTIONS

Build = Callable[[list[dict], bool], str]
Text = str | Callable[..., str]


NL = "\x00"  # in a builder's marker text: a line break the model may leave out


def lit(text: str) -> str:
    """``text`` as a Lark string literal; where it holds ``NL``, a sequence of literals
    with an optional line break at each."""
    if NL not in text:
        return json.dumps(text, ensure_ascii=False)
    parts = text.split(NL)
    out = []
    for k, part in enumerate(parts):
        out += [json.dumps(part, ensure_ascii=False)] if part else []
        out += ['"\\n"?'] if k < len(parts) - 1 else []
    return " ".join(out)


def rx(text: str) -> str:
    """``text`` matched literally inside a Lark ``/regex/``."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}/-" else {"\n": "\\n"}.get(c, c) for c in text)


def _json(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})


def _params(fn: dict) -> dict:
    return fn.get("parameters") or {"type": "object"}


def _repeat(call: str, joiner: str, parallel: bool) -> str:
    return f"{call} ({lit(joiner)} {call})*" if parallel else call


def objects(
    opening: str,
    closing: str,
    *,
    mode: str = "each",
    name_key: str = "name",
    args_key: str | None = "arguments",
    before: dict | None = None,
    after: dict | None = None,
    listing: tuple[str, str, str] = ("[", ", ", "]"),
) -> Build:
    """Calls as JSON objects ``{name_key: NAME, args_key: {...}}`` (``args_key`` None:
    Apertus' ``{NAME: {...}}``). ``mode``: ``each`` (every call in its own
    ``opening``/``closing``, one per line), ``list`` (a JSON list between them), ``lines``
    (one object per line between them), ``one`` (a single call). ``before``/``after``:
    further fields the family writes ({key: schema}), before and after those two.
    ``listing``: how a list opens, separates and closes (Command R7B indents it)."""

    def build(tools: list[dict], parallel: bool) -> str:
        options = []
        for tool in tools:
            fn = tool["function"]
            if args_key is None:
                props, required = {fn["name"]: _params(fn)}, [fn["name"]]
            else:
                props = {**(before or {}), name_key: {"const": fn["name"]}, args_key: _params(fn), **(after or {})}
                required = list(props)
            options.append({"type": "object", "properties": props, "required": required, "additionalProperties": False})
        one = options[0] if len(options) == 1 else {"anyOf": options}
        call = f"{_json(one)}"
        if mode == "list":
            items = _repeat(call, listing[1], parallel)
            return f"start: {lit(opening + listing[0])} {items} {lit(listing[2] + closing)}"
        if mode == "lines":
            return f"start: {lit(opening)} {_repeat(call, chr(10), parallel)} {lit(closing)}"
        if mode == "one":
            return f"start: {lit(opening)} {call} {lit(closing)}".replace(' ""', "")
        return f"start: {_repeat('call', chr(10), parallel)}\ncall: {lit(opening)} {call} {lit(closing)}"

    return build


def named(head: Callable[[str], str], closing: str, *, section: tuple[str, str] = ("", ""), joiner: str = "") -> Build:
    """Calls ``head(name)`` (a Lark expression) then the arguments as a JSON object then
    ``closing``; all of them between ``section``'s markers, ``joiner`` between calls."""

    def build(tools: list[dict], parallel: bool) -> str:
        rules = [f"f{i}: {head(t['function']['name'])} {_json(_params(t['function']))}" for i, t in enumerate(tools)]
        call = f"call: ({' | '.join(f'f{i}' for i in range(len(tools)))}) {lit(closing)}"
        start = f"start: {lit(section[0])} {_repeat('call', joiner, parallel)} {lit(section[1])}"
        return "\n".join([start.replace('"" ', "").replace(' ""', ""), call.replace(' ""', ""), *rules])

    return build


def _text(value: Text, *args) -> str:
    return value(*args) if callable(value) else value


def keyed(
    call_open: Callable[[str], str],
    call_close: str,
    param_open: Callable[[str, dict], str],
    param_close: Text,
    *,
    section: tuple[str, str] = ("", ""),
    joiner: str = "",
    between: str | None = None,
    quotes: str = "",
) -> Build:
    """Calls ``call_open(name)``, one ``param_open(key, schema)`` value
    ``param_close[(key)]`` per argument, ``call_close``. The required arguments in the
    schema's order, the optional ones may follow; with ``between`` (a separator, as in
    Gemma 4's ``k:v,k:v``) the required ones only, in sorted order. A string is written
    between ``quotes``."""

    def value(schema: dict, closing: str) -> str:
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(x, str) for x in enum):
            return f"({' | '.join(lit(quotes + x + quotes) for x in enum)}) {lit(closing)}".replace(' ""', "")
        if schema.get("type") == "string":  # text and its end in one lexeme: none backs off
            head, sep, tail = closing.partition(NL)
            text = "[^<" + rx(quotes[:1]) + "]*" if quotes[:1] not in ("", "<") else "[^<]*"
            return f"{lit(quotes)} /{text}{rx(quotes + head)}/ {lit(NL + tail) if sep else ''}".replace('"" ', "")
        return f"{_json(schema)} {lit(closing)}".replace(' ""', "")

    def build(tools: list[dict], parallel: bool) -> str:
        rules, functions = [], []
        for i, tool in enumerate(tools):
            fn = tool["function"]
            params = _params(fn)
            required = list(params.get("required") or [])
            props = {k: v if isinstance(v, dict) else {} for k, v in (params.get("properties") or {}).items()}
            keys = sorted(k for k in required if k in props) if between is not None else list(props)
            body = []
            for j, key in enumerate(keys):
                opening, closing = param_open(key, props[key]), _text(param_close, key)
                rules.append(f"p{i}_{j}: {lit(opening)} {value(props[key], closing)}")
                body.append(f"p{i}_{j}" + ("" if key in required or between is not None else "?"))
            joined = f" {lit(between)} ".join(body) if between else " ".join(body)
            rules.append(f"f{i}: {lit(call_open(fn['name']))} {joined} {lit(call_close)}".replace(' ""', ""))
            functions.append(f"f{i}")
        start = f"start: {lit(section[0])} {_repeat('call', joiner, parallel)} {lit(section[1])}"
        call = f"call: {' | '.join(functions)}"
        return "\n".join([start.replace('"" ', "").replace(' ""', ""), call, *rules])

    return build
