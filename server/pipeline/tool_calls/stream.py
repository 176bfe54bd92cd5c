"""Tool calls found in a model's text as it streams: content goes out at once, except
what may begin a call's opening marker; a call goes out when its closing marker (or the
answer's end) completes it; what the family's reader cannot read goes out as content,
and so does a call of a tool the request did not offer (a JSON answer
``{"name": "Alice", "age": 30}`` is no call of a tool named Alice). No text a model
writes makes a reader raise: whatever it cannot take is content."""

from __future__ import annotations

from server.pipeline.reasoning import held
from server.pipeline.tool_calls.call import ToolCall, param_schemas, tool_names
from server.pipeline.tool_calls.families import BY_NAME


class ToolCallStream:
    """``push(text)`` -> content strings and ToolCalls, in order, as soon as each is
    complete; ``flush()`` at the end."""

    def __init__(self, fmt: str, tools: list[dict] | None = None):
        """``fmt``: a family's name (families.FAMILIES); ``tools``: the request's, whose
        schemas type the values of families that write arguments one by one."""
        self.syntax = BY_NAME[fmt]
        self._schemas = param_schemas(tools)
        self._names = tool_names(tools)
        self._buf = ""
        self._open: tuple[str, str | None] | None = None  # the markers of the call being read
        self._said = False  # whether any content went out (``first`` families: a call only before)
        self._searched = 0  # how much of a call's buffered text holds no closing marker
        self._after_call = False  # a call just closed: the newlines that follow are dropped

    def _opening(self) -> tuple[int, tuple[str, str | None]] | None:
        if self.syntax.first:
            head = self._buf.lstrip()
            if self._said:
                return None
            found = [p for p in self.syntax.pairs if head.startswith(p[0])]
            return (len(self._buf) - len(head), found[0]) if found else None
        found = [(self._buf.find(p[0]), p) for p in self.syntax.pairs if p[0] in self._buf]
        return min(found, key=lambda x: x[0]) if found else None

    def _hold(self) -> int:
        """How much of the buffer's end may still become an opening marker."""
        if self.syntax.first:
            head = self._buf.lstrip()
            maybe = not self._said and (not head or any(p[0].startswith(head) for p in self.syntax.pairs))
            return len(self._buf) if maybe else 0
        partial = max(held(self._buf, p[0]) for p in self.syntax.pairs)
        before = self._buf[: len(self._buf) - partial]
        return partial + len(before) - len(before.rstrip("\n"))  # newlines a call's opening would drop

    def push(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while self._buf:
            if self._open is None:
                if self._after_call:  # newlines after a call's closing marker are the call's, in any chunks
                    self._buf = self._buf.lstrip("\n")
                    if not self._buf:
                        break
                    self._after_call = False
                found = self._opening()
                if found is None:
                    keep = self._hold()
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                at, self._open = found
                out.append(self._buf[:at].rstrip("\n"))
                self._buf = self._buf[at + len(self._open[0]) :]
            else:
                closing = self._open[1]
                end = self._buf.find(closing, max(0, self._searched - len(closing) + 1)) if closing else -1
                if end < 0:
                    self._searched = len(self._buf)  # a long call is searched once, not at every piece
                    break
                body, self._buf = self._buf[:end], self._buf[end + len(closing) :]
                self._after_call = True
                out += self._read(body)
        out = [p for p in out if p != ""]
        self._said = self._said or any(isinstance(p, str) and p.strip() for p in out)
        return out

    def _read(self, body: str) -> list[str | ToolCall]:
        opening, closing = self._open
        self._open, self._searched = None, 0
        try:
            got = self.syntax.read(self.syntax.region(opening, body, closing or ""), self._schemas)
        except Exception:  # noqa: BLE001 - a reader's failure on model text: the text stays content
            got = None
        if got is not None and self._names is not None:
            if any(isinstance(p, ToolCall) and p.name not in self._names for p in got):
                got = None  # a tool the request did not offer: no call
        return got if got is not None else [opening + body + (closing or "")]

    def flush(self) -> list[str | ToolCall]:
        if self._open is None:
            rest, self._buf = self._buf, ""
            return [rest] if rest else []
        if self._open[1] is None:
            body, self._buf = self._buf, ""
            return [p for p in self._read(body) if p != ""]
        rest, self._buf = self._open[0] + self._buf, ""
        self._open, self._searched = None, 0
        return [rest]


def parse(fmt: str, text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer; text that is not a well-formed call stays content."""
    stream = ToolCallStream(fmt, tools)
    parts = stream.push(text) + stream.flush()
    content = "".join(p for p in parts if isinstance(p, str))
    return content, [p for p in parts if isinstance(p, ToolCall)]
