"""One chat choice's text turned into OpenAI's message parts: the reasoning split first,
then tool calls found in what is left. The same object serves a stream (``push`` each
piece, then ``finish``) and a whole answer (one ``push``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.reasoning import ReasoningSplitter
from server.tool_calls import ToolCall, ToolCallStream


@dataclass
class Parts:
    """What one piece of text added: reasoning text, content text, completed calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __iadd__(self, other: Parts) -> Parts:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls += other.calls
        return self


class ChatOutput:
    """``reasoning_format``: see server.reasoning; ``opened``: the prompt left a
    <think> open; ``tool_format``: the template family's call format, None when the
    request offers no tools (or tool_choice is "none")."""

    def __init__(self, reasoning_format: str, opened: bool, tool_format: str | None):
        self._split = ReasoningSplitter(reasoning_format, opened)
        self._tools = ToolCallStream(tool_format) if tool_format else None
        self.n_calls = 0

    def push(self, text: str) -> Parts:
        reasoning, content = self._split.push(text)
        return self._content(Parts(reasoning), content, final=False)

    def finish(self) -> Parts:
        reasoning, content = self._split.flush()
        return self._content(Parts(reasoning), content, final=True)

    def _content(self, parts: Parts, content: str, final: bool) -> Parts:
        if self._tools is None:
            parts.content = content
            return parts
        pieces = self._tools.push(content) + (self._tools.flush() if final else [])
        for piece in pieces:
            if isinstance(piece, ToolCall):
                parts.calls.append(piece)
            else:
                parts.content += piece
        self.n_calls += len(parts.calls)
        return parts

    def finish_reason(self, reason: str | None) -> str | None:
        """``tool_calls`` when the answer made calls and ended by itself."""
        return "tool_calls" if self.n_calls and reason == "stop" else reason
