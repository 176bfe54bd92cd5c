"""Rendering a chat template (jinja2, in transformers' environment: engine/text/template_env.py): the model's own,
or a built-in one chosen by name (llama-server's ``--chat-template``). Every name
llama-server knows renders what llama-server renders for it: its C++ formats
(engine/text/llama_formats.py), except where a jinja template here renders the same
text and more (tools, thinking: ``JINJA_NAMES``); a few names of our own (deepseek-r1,
hermes, qwen3, ...) are jinja only."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError

from engine.text.llama_formats import FORMATS
from engine.text.template_env import plain_messages, template_environment

TEMPLATES = Path(__file__).parent / "templates"
ALIASES = {
    "hermes": "chatml",
    "qwen2.5": "chatml",
    "qwen3": "chatml",
    "mistral": "mistral-v7",
    "phi3.5": "phi3",
    "gemma2": "gemma",
}
JINJA_NAMES = {"chatml", "phi3"}  # llama-server's names whose jinja here renders its text exactly (tested)


class ChatTemplateError(ValueError):
    """The template raised, or failed to parse."""


def builtin_names() -> list[str]:
    return sorted({p.stem for p in TEMPLATES.glob("*.jinja")} | set(ALIASES) | set(FORMATS))


_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def builtin_source(name: str) -> str | None:
    """A built-in template's jinja source by name (or alias); None for anything else,
    template text included (never looked up as a file name)."""
    name = ALIASES.get(name, name)
    if not _NAME.fullmatch(name) or name.startswith("."):
        return None
    path = TEMPLATES / f"{name}.jinja"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def resolve_template(spec: str) -> tuple[str, str | None]:
    """(name, source) of ``--chat-template``'s value: a built-in name (source None: one
    of llama-server's C++ formats), else jinja text (named "custom"). A single word that
    is not a built-in is refused (ValueError): it is a misspelt name, not a template."""
    name = ALIASES.get(spec, spec)
    if name in FORMATS and name not in JINJA_NAMES:
        return name, None
    source = builtin_source(spec)
    if source is not None:
        return ALIASES.get(spec, spec), source
    if "{" not in spec:
        raise ValueError(f"unknown chat template {spec!r}; built-in: {', '.join(builtin_names())}")
    return "custom", spec


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None], name: str = "model"):
        env = template_environment()
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc}") from exc
        self.source, self.name = source, name
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    @functools.cached_property
    def content_forms(self) -> tuple[bool, bool]:
        """(strings, parts): whether the template renders a message's content given as a
        string, and given as typed parts (``[{"type": "text", "text": ...}]``), probed
        once as llama.cpp probes a template. A template that iterates the content
        (SmolVLM's, Idefics3's) drops a string's text; one that prints the content whole
        prints a list of parts as its Python repr."""
        probe = "\u2063probe\u2063"

        def shows(content) -> str | None:
            try:
                return self.render([{"role": "user", "content": content}], True)
            except ChatTemplateError:
                return None

        as_string, as_parts = shows(probe), shows([{"type": "text", "text": probe}])
        strings = as_string is not None and probe in as_string
        parts = as_parts is not None and probe in as_parts and "'text'" not in as_parts and '"text"' not in as_parts
        return strings, parts

    @functools.cached_property
    def image_text(self) -> str | None:
        """What the template writes for an image part (``{"type": "image"}``), probed
        once: Gemma 3's ``<start_of_image>``, SmolVLM's ``<image>``, Qwen2-VL's
        ``<|vision_start|><|image_pad|><|vision_end|>``; None when it writes nothing."""
        a, b = "\u2063a\u2063", "\u2063b\u2063"
        content = [{"type": "text", "text": a}, {"type": "image"}, {"type": "text", "text": b}]
        try:
            text = self.render([{"role": "user", "content": content}], True)
        except ChatTemplateError:
            return None
        if a not in text or b not in text:
            return None
        between = text[text.index(a) + len(a) : text.index(b)].strip()
        return between or None

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders a request's ``tools`` itself."""
        return "tools" in self.source

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **extra: Any,
    ) -> str:
        """``extra``: more template variables (``chat_template_kwargs``, e.g. ``enable_thinking``).
        Raises ChatTemplateError when the template raises on this conversation, whatever
        it raises (``raise_exception``, an undefined name, a type error in its code)."""
        variables = {**self.special_tokens, **extra, "messages": plain_messages(messages)}
        variables["add_generation_prompt"] = add_generation_prompt
        variables["tools"] = tools or None  # defined, as transformers passes it (``tools is defined`` holds)
        variables.setdefault("documents", None)
        try:
            return self.template.render(**variables)
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
            why = f"the chat template failed on this conversation: {type(exc).__name__}: {exc}"
            raise ChatTemplateError(why) from exc
