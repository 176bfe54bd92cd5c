"""The special tokens a chat answer's text keeps although special tokens are skipped
(llama.cpp's preserved tokens): the markers of the template family's tool calls and
thoughts, so that the answer can be read (tool_calls, reasoning)."""

from __future__ import annotations

import weakref

from server.pipeline.thinking_syntax import Thinking
from server.pipeline.tool_calls import marker_text

_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(family, thinking): ids}


def preserved(tokenizer, tool_format: str | None, thinking: Thinking | None = None) -> frozenset[int]:
    """The ids of the special tokens among the family's markers (none where the
    tokenizer marks no token special); once per tokenizer, family and thought syntax,
    kept while the tokenizer lives (a model put to sleep takes its answers with it)."""
    found = _FOUND.setdefault(tokenizer, {})
    key = (tool_format, thinking)
    if key not in found:
        found[key] = _preserved(tokenizer, tool_format, thinking)
    return found[key]


def _preserved(tokenizer, tool_format: str | None, thinking: Thinking | None) -> frozenset[int]:
    special = getattr(tokenizer, "special_ids", frozenset())
    text = (marker_text(tool_format) if tool_format else "") + (
        "".join([thinking.start, thinking.end, *thinking.drop]) if thinking else ""
    )
    if not special or not text:
        return frozenset()
    return frozenset(i for i in tokenizer.encode(text, add_special=False) if i in special)
