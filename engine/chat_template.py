"""Rendering a model's jinja2 chat template (sandboxed, as transformers does)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template raised, or failed to parse."""


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None]):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc}") from exc
        self.source = source
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        try:
            return self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **extra
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
