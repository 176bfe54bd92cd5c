"""The jinja environment chat templates are written for: transformers' (its
``apply_chat_template``), so that every template transformers renders renders here the
same way. Sandboxed (immutable), ``trim_blocks`` and ``lstrip_blocks``, with:

- ``tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)``:
  ``json.dumps`` with those arguments (jinja's own escapes HTML and takes fewer);
- ``{% generation %}...{% endgeneration %}``: transformers marks the assistant's
  tokens with it; it renders its body unchanged (LFM2.5 and poolside's templates use it);
- ``{% break %}`` / ``{% continue %}`` (jinja's loop controls);
- ``raise_exception(message)``: the template refuses the conversation (a TemplateError);
- ``strftime_now(format)``: the local time, formatted;
- ``dict(...)`` and ``namespace(...)`` that refuse underscore-prefixed attribute names,
  as transformers' do (no way to CPython's internals through them).

``plain_messages`` gives messages the shape transformers gives them: the reasoning of
an assistant turn under ``reasoning_content`` and ``thinking`` alike, whichever name the
client used (``reasoning``, ``reasoning_content``, ``thinking``), since templates read
one or the other (gpt-oss reads ``thinking``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import nodes, pass_eval_context
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' order


class GenerationBlock(Extension):
    """``{% generation %}body{% endgeneration %}`` renders ``body``."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    @pass_eval_context
    def _render(self, context, caller) -> str:
        return caller()


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a chat template cannot store an underscore-prefixed attribute ({name!r})")


class _Namespace(Namespace):
    def __init__(*args, **kwargs):  # jinja's signature: namespace(self=...) still works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _check_name(name)
        Namespace.__setitem__(self, name, value)


def template_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each message with its reasoning under ``thinking`` and ``reasoning_content`` both."""
    out = []
    for message in messages:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out
