"""The special tokens a chat answer's text keeps although special tokens are skipped
(llama.cpp's preserved tokens): the markers of the template family's tool calls and
thoughts, so that the answer can be read (tool_calls, reasoning)."""

from __future__ import annotations

import functools

from server.pipeline.thinking_syntax import Thinking
from server.pipeline.tool_calls import marker_text


@functools.lru_cache(maxsize=64)  # once per model, family and thought syntax, not per request
def preserved(tokenizer, tool_format: str | None, thinking: Thinking | None = None) -> frozenset[int]:
    """The ids of the special tokens among the family's markers (none where the
    tokenizer marks no token special)."""
    special = getattr(tokenizer, "special_ids", frozenset())
    text = (marker_text(tool_format) if tool_format else "") + (
        "".join([thinking.start, thinking.end, *thinking.drop]) if thinking else ""
    )
    if not special or not text:
        return frozenset()
    return frozenset(i for i in tokenizer.encode(text, add_special=False) if i in special)
