"""Readers of the text between a family's opening and closing markers: each takes that
text and the request's parameter schemas and gives the calls (and any plain text the
family writes among them), or None when the text is not what the family writes — then
the stream gives it back as content, never an error.

A reader's contract: ``read(body: str, schemas: Schemas) -> list[str | ToolCall] | None``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable

from server.pipeline.tool_calls.call import Schemas, ToolCall, from_object, loads, make, typed

Reader = Callable[[str, Schemas], "list[str | ToolCall] | None"]


def after(marker: str, read: Reader) -> Reader:
    """``read`` of what follows ``marker`` (Muse's ``to=NAME<|message|>`` header before
    its calls), or of the whole text when it has no such header."""
    return lambda body, schemas: read(body.partition(marker)[2] if marker in body else body, schemas)


def _fence(text: str) -> str:
    """The text inside a Markdown code fence (```json ... ```), or the text."""
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rstrip().removesuffix("```")
    return text.strip()


def json_calls(body: str, schemas: Schemas) -> list | None:
    """One JSON call, a JSON list of calls, or one call per line (MiniMax M1); the
    objects in any shape ``from_object`` reads; a Markdown fence around them is allowed."""
    text = _fence(body)
    value = loads(text)
    if value is None:
        lines = [loads(line) for line in text.splitlines() if line.strip()]
        value = lines if lines and all(x is not None for x in lines) else None
    items = value if isinstance(value, list) else [value]
    calls = [from_object(x) for x in items]
    return calls if calls and all(calls) else None


def _all_matched(pattern: re.Pattern, text: str) -> list[re.Match] | None:
    """Every match of ``pattern`` in ``text``, or None when anything but white space is
    left between them."""
    found = list(pattern.finditer(text))
    return found if found and not pattern.sub("", text).strip() else None


def named_json(pattern: str, name: Callable[[str], str] = str.strip) -> Reader:
    """Calls each matched by ``pattern`` (groups ``head`` and ``args``): the function's
    name read from the head, its arguments a JSON object (DeepSeek, Kimi K2, Solar,
    Functionary, Mistral's newer form)."""
    compiled = re.compile(pattern, re.S)

    def read(body: str, schemas: Schemas) -> list | None:
        found = _all_matched(compiled, body)
        if found is None:
            return None
        calls = []
        for m in found:
            head, args = name(m.group("head")), m.group("args")
            if head == "function" and "\n" in args and "```" in args:  # DeepSeek R1: NAME then a fence
                head, args = args.split("\n", 1)
            groups = m.groupdict()
            calls.append(make(head, _fence(args), (groups.get("id") or "").strip()))
        return calls if all(calls) else None

    return read


def mistral(body: str, schemas: Schemas) -> list | None:
    """After ``[TOOL_CALLS]``: a JSON list of calls (Nemo, Small 3.1), or ``NAME[ARGS]{...}``
    (with ``[CALL_ID]id`` in Small 3.2), each call after its own ``[TOOL_CALLS]``."""
    if body.lstrip().startswith("["):
        return json_calls(body, schemas)
    calls = []
    for part in body.split("[TOOL_CALLS]"):
        head, sep, args = part.partition("[ARGS]")
        name, _, call_id = head.partition("[CALL_ID]")
        calls.append(make(name, args.strip(), call_id.strip()) if sep else None)
    return calls if all(calls) else None


def keyed(calls: str | Callable[[str], list[tuple[str, str]] | None], params: str) -> Reader:
    """Calls whose arguments are written one element per parameter: ``calls`` matches
    each call (groups ``name`` and ``body``; or splits the text into (name, body)
    pairs, None when it cannot); ``params`` each argument in a body (groups ``key`` and
    ``value``, and ``string`` where the family writes whether the value is a string:
    ``true``/``string`` or not). Values are read by their schema's type."""
    param_rx = re.compile(params, re.S)
    if isinstance(calls, str):
        call_rx = re.compile(calls, re.S)

        def calls(body: str) -> list[tuple[str, str]] | None:
            found = _all_matched(call_rx, body)
            return None if found is None else [(m.group("name"), m.group("body")) for m in found]

    def read(body: str, schemas: Schemas) -> list | None:
        found = calls(body)
        if found is None:
            return None
        out = []
        for name, inner in found:
            name = name.strip()
            props = schemas.get(name, {})
            if param_rx.sub("", inner).strip():
                return None
            args = {}
            for p in param_rx.finditer(inner):
                key, value = p.group("key").strip(), _cdata(p.group("value"))
                said = p.groupdict().get("string")  # the family's own word on the value's type
                schema = props.get(key) if said is None else {"type": "string"} if said in ("true", "string") else {}
                args[key] = typed(value, schema)
            out.append(make(name, args))
        return out if all(out) else None

    return read


def _cdata(text: str) -> str:
    """A value as written, without MiniCPM's ``<![CDATA[...]]>`` wrapper."""
    stripped = text.strip()
    if stripped.startswith("<![CDATA[") and stripped.endswith("]]>"):
        return stripped[9:-3]
    return text


def glm_call(body: str) -> list[tuple[str, str]] | None:
    """GLM's one call: the name, then its ``<arg_key>`` pairs (split, not matched: a
    name is one line)."""
    head, mark, rest = body.partition("<arg_key>")
    name = head.strip()
    return [(name, mark + rest)] if name and "\n" not in name and "<" not in name else None


MINIMAX3_SEP = "]<]minimax[>["
ELEMENT = re.compile(r"\s*<([A-Za-z_][\w.-]*)>")


def _elements(text: str) -> list[tuple[str, str]] | None:
    """``<tag>inner</tag>`` siblings in order, or None when ``text`` is not only them."""
    out, at = [], 0
    while text[at:].strip():
        opened = ELEMENT.match(text, at)
        if opened is None:
            return None
        tag, depth, scan = opened.group(1), 1, opened.end()
        tags = re.compile(f"<(/?){re.escape(tag)}>")
        while depth:
            m = tags.search(text, scan)
            if m is None:
                return None
            depth += -1 if m.group(1) else 1
            scan = m.end()
        out.append((tag, text[opened.end() : m.start()]))
        at = scan
    return out


def _element_value(inner: str, schema: dict | None) -> object:
    schema = schema or {}
    kind = schema.get("type")
    children = _elements(inner) if kind != "string" and inner.lstrip().startswith("<") else None
    if children is None:
        if kind in ("array", "object") and not inner.strip():
            return [] if kind == "array" else {}
        return typed(inner, schema)
    if kind == "array" or (kind is None and children and all(tag == "item" for tag, _ in children)):
        return [_element_value(v, schema.get("items")) for _, v in children]
    props = schema.get("properties") or {}
    return {tag: _element_value(v, props.get(tag)) for tag, v in children}


def minimax3(body: str, schemas: Schemas) -> list | None:
    """MiniMax M3: ``<invoke name="NAME">`` with one element per argument, arrays as
    ``<item>`` elements and objects as nested elements, every tag after M3's separator."""
    found = _all_matched(re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.S), body.replace(MINIMAX3_SEP, ""))
    if found is None:
        return None
    calls = []
    for m in found:
        props = schemas.get(m.group(1), {})
        children = _elements(m.group(2))
        if children is None:
            return None
        calls.append(make(m.group(1), {k: _element_value(v, props.get(k)) for k, v in children}))
    return calls if all(calls) else None


class _Literals(ast.NodeTransformer):
    """JSON's ``true``/``false``/``null`` as the Python constants they mean."""

    NAMES = {"true": True, "false": False, "null": None}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(self.NAMES[node.id]) if node.id in self.NAMES else node


def _escape_newlines(code: str) -> str:
    """``code`` with the line breaks inside its quoted strings escaped (LFM2 writes a
    string's line breaks as they are, which Python does not read)."""
    out, quote, at = [], None, 0
    while at < len(code):
        c = code[at]
        if quote and c == "\\":
            out.append(code[at : at + 2])
            at += 2
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        out.append("\\n" if c == "\n" and quote else c)
        at += 1
    return "".join(out)


def pythonic(body: str, schemas: Schemas) -> list | None:
    """LFM2's ``[name(key=value, ...), ...]``: Python calls with literal arguments."""
    try:
        tree = _Literals().visit(ast.parse(_escape_newlines(body.strip()), mode="eval")).body
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls = []
        for node in nodes:
            if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
                return None
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
            calls.append(make(ast.unparse(node.func), args))
        return calls if calls and all(calls) else None
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


GEMMA_TOKEN = re.compile(
    r'<\|"\|>(?P<s>.*?)<\|"\|>|(?P<key>[A-Za-z_][\w.-]*)(?=\s*:)|(?P<punct>[{}\[\],:])|(?P<raw>[^{}\[\],:<]+)', re.S
)


def gemma4(body: str, schemas: Schemas) -> list | None:
    """Gemma 4's ``call:NAME{key:value,...}``: bare keys, strings between ``<|"|>``."""
    head, brace, rest = body.strip().partition("{")
    if not head.startswith("call:") or not brace:
        return None
    parts, at, text = [], 0, brace + rest
    for m in GEMMA_TOKEN.finditer(text):
        if m.start() != at:
            return None
        at = m.end()
        if m.group("s") is not None:
            parts.append(json.dumps(m.group("s"), ensure_ascii=False))
        elif m.group("key") is not None:
            parts.append(json.dumps(m.group("key")))
        else:
            parts.append(m.group(0))
    args = loads("".join(parts)) if at == len(text) else None
    call = make(head[5:], args) if isinstance(args, dict) else None
    return [call] if call else None


def functionary32(body: str, schemas: Schemas) -> list | None:
    """Functionary v3.2's ``>>>NAME\\n{...}`` turns; ``>>>all`` is text for the user."""
    out: list = []
    for part in body.split(">>>"):
        if not part.strip():
            continue
        name, _, content = part.partition("\n")
        if name.strip() == "all":
            out.append(content)
            continue
        call = make(name, content.strip())
        if call is None:
            return None
        out.append(call)
    return out or None


def gpt_oss(body: str, schemas: Schemas) -> list | None:
    """gpt-oss's call after ``to=functions.``: ``NAME<|channel|>commentary json<|message|>{...}``
    (or with ``<|constrain|>json``), up to ``<|call|>``."""
    head, sep, args = body.partition("<|message|>")
    name = re.match(r"[^\s<]+", head)
    call = make(name.group(0), args.strip().removesuffix("<|call|>").strip()) if sep and name else None
    return [call] if call else None
