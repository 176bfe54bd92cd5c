"""A chat template's family: how the answers of its models write tool calls and
thoughts, found once per template from the marks its source holds. The tool-call
families are tried in order (server/pipeline/tool_calls/families.py: the first whose
marks are all in the source; ``hermes`` has none); the family then names the thought
syntaxes its templates write (server/pipeline/thinking_syntax.py, ``BY_FAMILY``: the
first whose marks the source holds, as Mistral's reasoning templates hold ``[THINK]``
and its others do not), else ``<think>``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from server.pipeline.thinking_syntax import BY_FAMILY, THINK, Thinking
from server.pipeline.tool_calls.families import FAMILIES
from server.pipeline.tool_calls.syntax import Syntax


@dataclass(frozen=True)
class TemplateFamily:
    calls: Syntax  # how its answers write tool calls
    thinking: Thinking  # and thoughts

    @property
    def name(self) -> str:
        """The family's name (its tool-call syntax's): ``hermes``, ``gpt-oss``..."""
        return self.calls.name


@functools.lru_cache(maxsize=16)  # once per template, not per request
def template_family(source: str | None) -> TemplateFamily:
    """The family of a chat template's source (None: no template, Hermes' and ``<think>``)."""
    text = source or ""
    calls = next(s for s in FAMILIES if all(mark in text for mark in s.marks))
    thinking = next((t for t in BY_FAMILY.get(calls.name, ()) if all(m in text for m in t.marks)), THINK)
    return TemplateFamily(calls, thinking)
