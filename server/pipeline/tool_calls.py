"""Tool calls in chat completions: how the template family writes a call, how calls are
found in the model's text (whole or streamed), and the grammar that forces a call when
``tool_choice`` requires one.

Families (chosen from the chat template in use):
- ``hermes`` (ChatML, Qwen, Hermes; also for templates that render no tools, which get
  the Hermes instructions as a system message): ``<tool_call>{"name", "arguments"}</tool_call>``
- ``llama3``: the answer is one JSON object ``{"name", "parameters"}``
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``
- ``xml`` (Qwen3-Coder, Qwen3.5, Nemotron 3, StepFun 3.5): ``<tool_call>`` then
  ``<function=NAME>``, one ``<parameter=KEY>`` block per argument (a string as it is,
  anything else as JSON: the templates write it so), ``</function></tool_call>``; each
  value is read back by its parameter's type in the request's tool schema
- ``glm`` (GLM 4.5+, poolside Laguna, Ling, Spark): ``<tool_call>NAME`` then
  ``<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>`` pairs, ``</tool_call>``; values
  as the ``xml`` family's
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from engine import JSON_OPTIONS
from server.pipeline.reasoning import held

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_OPEN = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


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


XML_FUNCTION = re.compile(r"<function=([^>\n]+)>\n?(.*?)</function>", re.S)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\n?", re.S)
GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)
ENVELOPED = ("hermes", "xml", "glm")  # calls inside <tool_call>...</tool_call>


def family(template_source: str) -> str:
    if "<function=" in template_source and "<parameter=" in template_source and HERMES_OPEN in template_source:
        return "xml"
    if "<arg_key>" in template_source and "<arg_value>" in template_source and HERMES_OPEN in template_source:
        return "glm"
    if MISTRAL_OPEN in template_source:
        return "mistral"
    if "<|start_header_id|>" in template_source:
        return "llama3"
    return "hermes"


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


def _call(obj: object, args_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), str(obj.get("id") or ""))


def param_types(tools: list[dict] | None) -> dict[str, dict[str, str]]:
    """Each tool's parameters' JSON types: {tool name: {parameter: type}}."""
    out: dict[str, dict[str, str]] = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


def _typed(text: str, kind) -> object:
    """A ``<parameter>`` block's text as its schema type says (the templates write a
    string as it is and anything else as JSON; a boolean as jinja prints it)."""
    if kind == "string":
        return text
    if kind == "boolean" and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    value = _json(text.strip())
    if value is not None or text.strip() == "null":
        return value
    if kind is None and text.strip() in ("True", "False"):
        return text.strip() == "True"
    return text


def _xml_call(body: str, types: dict[str, dict[str, str]]) -> ToolCall | None:
    found = XML_FUNCTION.fullmatch(body.strip())
    if found is None:
        return None
    name, inner = found.group(1).strip(), found.group(2)
    if XML_PARAMETER.sub("", inner).strip():
        return None  # text outside the parameters: not a call this family writes
    kinds = types.get(name, {})
    args = {
        p.group(1).strip(): _typed(p.group(2), kinds.get(p.group(1).strip())) for p in XML_PARAMETER.finditer(inner)
    }
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _glm_call(body: str, types: dict[str, dict[str, str]]) -> ToolCall | None:
    head, mark, rest = body.strip().partition("<arg_key>")
    name = head.strip()
    if not name or "\n" in name or "<" in name or GLM_ARGUMENT.sub("", mark + rest).strip():
        return None
    kinds = types.get(name, {})
    args = {}
    for p in GLM_ARGUMENT.finditer(mark + rest):
        key = p.group(1).strip()
        args[key] = _typed(p.group(2), kinds.get(key))
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def parse(fmt: str, text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer; text that is not a well-formed call stays content."""
    stream = ToolCallStream(fmt, tools)
    parts = stream.push(text) + stream.flush()
    content = "".join(p for p in parts if isinstance(p, str))
    return content, [p for p in parts if isinstance(p, ToolCall)]


class ToolCallStream:
    """``push(text)`` -> content strings and ToolCalls, in order, as soon as each is
    complete; ``flush()`` at the end. Content that may begin a call is held back."""

    def __init__(self, fmt: str, tools: list[dict] | None = None):
        """``tools``: the request's, whose parameter types read the ``xml`` family's values."""
        self.fmt = fmt
        self._types = param_types(tools)
        self._buf = ""
        self._in_call = False
        self._started = False  # llama3: whether the answer's first characters were seen

    def push(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        return self._hermes() if self.fmt in ENVELOPED else self._whole_answer()

    def _hermes(self) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        while self._buf:
            if not self._in_call:
                at = self._buf.find(HERMES_OPEN)
                if at < 0:
                    keep = held(self._buf, HERMES_OPEN)
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                out.append(self._buf[:at].rstrip("\n"))
                self._buf, self._in_call = self._buf[at + len(HERMES_OPEN) :], True
            else:
                end = self._buf.find(HERMES_CLOSE)
                if end < 0:
                    break
                body, self._buf = self._buf[:end], self._buf[end + len(HERMES_CLOSE) :].lstrip("\n")
                self._in_call = False
                call = self._read(body)
                out.append(call if call else HERMES_OPEN + body + HERMES_CLOSE)
        return [p for p in out if p != ""]

    def _read(self, body: str) -> ToolCall | None:
        if self.fmt == "xml":
            return _xml_call(body, self._types)
        if self.fmt == "glm":
            return _glm_call(body, self._types)
        return _call(_json(body.strip()))

    def _whole_answer(self) -> list[str | ToolCall]:
        """llama3 and mistral: a call takes the whole answer; decided by its beginning."""
        if self._in_call:
            return []
        head = self._buf.lstrip()
        opener = MISTRAL_OPEN if self.fmt == "mistral" else None
        if self.fmt == "llama3" and (head.startswith("{") or head.startswith(PYTHON_TAG)):
            self._in_call = True
            return []
        if opener and opener in self._buf:
            at = self._buf.find(opener)
            content, self._buf, self._in_call = self._buf[:at], self._buf[at:], True
            return [content] if content else []
        if opener:
            keep = held(self._buf, opener)
        else:
            keep = len(self._buf) if not head or PYTHON_TAG.startswith(head) else 0
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return [out] if out else []

    def flush(self) -> list[str | ToolCall]:
        rest, self._buf = self._buf, ""
        if self.fmt in ENVELOPED:
            return [HERMES_OPEN + rest] if self._in_call and rest else ([rest] if rest else [])
        if not self._in_call:
            return [rest] if rest else []
        if self.fmt == "llama3":
            body = rest.strip().removeprefix(PYTHON_TAG).strip()
            calls = [_call(x, "parameters") for x in ([_json(body)] if body.startswith("{") else [])]
        else:
            listed = _json(rest.strip().removeprefix(MISTRAL_OPEN).strip())
            calls = [_call(x) for x in listed] if isinstance(listed, list) else [None]
        return calls if calls and all(calls) else [rest]


def _schema(tools: list[dict], args_key: str) -> dict:
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {**JSON_OPTIONS, "lenient": True}}


def forced_grammar(fmt: str, tools: list[dict], parallel: bool) -> str:
    """A Lark grammar (llguidance) whose every sentence is a well-formed call of one of
    ``tools`` in the family's format: what ``tool_choice`` "required" or a named
    function samples under."""
    if fmt == "llama3":
        return f"start: %json {json.dumps(_schema(tools, 'parameters'))}"
    if fmt in ("xml", "glm"):
        return _tagged_grammar(fmt, tools, parallel)
    schema = _schema(tools, "arguments")
    if fmt == "mistral":
        one = {k: v for k, v in schema.items() if k != "x-guidance"}
        listed = {"type": "array", "items": one, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        listed["x-guidance"] = schema["x-guidance"]
        return f'start: "{MISTRAL_OPEN}" %json {json.dumps(listed)}'
    repeat = ' ("\\n" call)*' if parallel else ""
    return f'start: call{repeat}\ncall: "{HERMES_OPEN}\\n" %json {json.dumps(schema)} "\\n{HERMES_CLOSE}"'


NEWLINE = "\n"


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _tagged_grammar(fmt: str, tools: list[dict], parallel: bool) -> str:
    """The ``xml`` or ``glm`` family's calls: each tool's required parameters in its
    schema's order, the optional ones may follow; a string value is one of its enum, or
    text without ``<``; any other a JSON value of its schema."""
    rules, functions = [], []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        params = fn.get("parameters") or {}
        required = set(params.get("required") or [])
        body = []
        for j, (key, schema) in enumerate((params.get("properties") or {}).items()):
            schema = schema if isinstance(schema, dict) else {}
            if fmt == "xml":
                opening, closing = _literal(f"<parameter={key}>\n"), "\n</parameter>\n"
            else:
                opening, closing = _literal(f"<arg_key>{key}</arg_key>\n<arg_value>"), "</arg_value>\n"
            enum = schema.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(x, str) for x in enum):
                value = "(" + " | ".join(_literal(x) for x in enum) + ") " + _literal(closing)
            elif schema.get("type") == "string":  # the text and its closing tag one lexeme: lexemes never back off
                value = "/[^<]*" + closing.replace("/", "\\/").replace("\n", "\\n") + "/"
            else:
                value = "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS}) + " " + _literal(closing)
            rules.append(f"p{i}_{j}: {opening} {value}")
            body.append(f"p{i}_{j}" + ("" if key in required else "?"))
        if fmt == "xml":
            opening, closing = _literal("<function=" + fn["name"] + ">\n"), _literal("</function>\n")
        else:
            opening, closing = _literal(fn["name"] + "\n"), _literal("")
        rules.append(f"f{i}: {opening} {' '.join(body)} {closing}".replace(' ""', ""))
        functions.append(f"f{i}")
    repeat = ' ("\\n" call)*' if parallel else ""
    head = HERMES_OPEN + NEWLINE if fmt == "xml" else HERMES_OPEN
    call = f"call: {_literal(head)} ({' | '.join(functions)}) {_literal(HERMES_CLOSE)}"
    return "\n".join([f"start: call{repeat}", call, *rules])
