"""Chat answers: one choice's text turned into OpenAI's message parts (the reasoning
split first, then tool calls found in what is left), and those parts as stream deltas
or as a whole message. The same objects serve a stream (``push`` each piece, then
``finish``) and a whole answer (one ``push``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.pipeline.reasoning import ReasoningSplitter
from server.pipeline.thinking_syntax import THINK, Thinking
from server.pipeline.tool_calls import ToolCall, ToolCallStream


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
    """``reasoning_format``: see server.pipeline.reasoning; ``opened``: the prompt left a
    <think> open; ``tool_format``: the template family's call format, None when the
    request offers no tools (or tool_choice is "none")."""

    def __init__(
        self,
        reasoning_format: str,
        opened: bool,
        tool_format: str | None,
        tools: list[dict] | None = None,
        thinking: Thinking = THINK,
    ):
        """``thinking``: the family's thought markers (server/pipeline/thinking_syntax.py)."""
        self._split = ReasoningSplitter(reasoning_format, opened, thinking)
        self._tools = ToolCallStream(tool_format, tools) if tool_format else None
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


def message_fields(parts: Parts, first_index: int | None) -> dict:
    """The non-empty parts as message (or, with ``first_index``, stream delta) fields."""
    fields: dict = {}
    if parts.reasoning:
        fields["reasoning_content"] = parts.reasoning
    if parts.content:
        fields["content"] = parts.content
    if parts.calls:
        base = first_index
        fields["tool_calls"] = [c.openai(None if base is None else base + i) for i, c in enumerate(parts.calls)]
    return fields


class ChatAnswer:
    """The ``n`` choices of one chat request as OpenAI writes them. ``logprob``: renders
    one TokenLogprob (None when the request asked for no logprobs)."""

    def __init__(
        self,
        n: int,
        reasoning_format: str,
        opened: bool,
        tool_format: str | None,
        logprob=None,
        tools=None,
        thinking=THINK,
    ):
        self.outputs = [ChatOutput(reasoning_format, opened, tool_format, tools, thinking) for _ in range(n)]
        self.logprob = logprob

    def opening(self) -> list[dict]:
        """As OpenAI and llama-server: each choice's role first, no content yet."""
        role = {"role": "assistant", "content": None}
        return [{"index": i, "delta": role, "logprobs": None, "finish_reason": None} for i in range(len(self.outputs))]

    def delta(self, d) -> dict | None:
        """A stream chunk's choice for one Delta; None when it adds nothing to send."""
        out = self.outputs[d.index]
        parts = out.push(d.text)
        if d.finished:
            parts += out.finish()
        delta = message_fields(parts, out.n_calls - len(parts.calls))
        lps = {"content": [self.logprob(d.logprob)]} if self.logprob and d.logprob else None
        if not delta and not d.finished and lps is None:
            return None
        return {"index": d.index, "delta": delta, "logprobs": lps, "finish_reason": out.finish_reason(d.finish_reason)}

    def choice(self, c) -> dict:
        """A whole choice (server.pipeline.generation.Choice) as a message."""
        out = self.outputs[c.index]
        parts = out.push(c.text)
        parts += out.finish()
        parts.reasoning = parts.reasoning.strip()
        message = {"role": "assistant", "content": parts.content if parts.content or not parts.calls else None}
        message.update({k: v for k, v in message_fields(parts, None).items() if k != "content"})
        lps = {"content": [self.logprob(lp) for lp in c.logprobs]} if self.logprob else None
        return {
            "index": c.index,
            "message": message,
            "logprobs": lps,
            "finish_reason": out.finish_reason(c.finish_reason),
        }
