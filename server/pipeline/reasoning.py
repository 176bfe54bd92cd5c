"""The reasoning split of chat answers (llama-server's ``--reasoning-format``): text
between ``<think>`` and ``</think>`` goes to ``reasoning_content``, the rest to
``content``, whole or streamed — in each template family's own markers
(server/pipeline/thinking_syntax.py: ``<think>``, ``<seed:think>``, gpt-oss's analysis
channel, Command R's, ...), the format's markers around the answer dropped.

Formats: ``none`` leaves the text as generated; ``deepseek`` (and ``auto``, the
default) splits; ``deepseek-legacy`` splits but also keeps the tags and the thought in
``content``. A prompt that ends inside an opened ``<think>`` (Qwen3 and DeepSeek-R1
templates open it for the model) starts the answer in the reasoning part.
"""

from __future__ import annotations

from server.pipeline.thinking_syntax import THINK, Thinking

FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def opens_thinking(prompt: str, thinking: Thinking = THINK) -> bool:
    """Whether the rendered prompt leaves a thought open for the model (the template
    opened it, or a prefilled assistant message is inside one)."""
    return prompt.rfind(thinking.start) > prompt.rfind(thinking.end)


def held(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (may complete later)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """``push(text) -> (reasoning, content)`` for each streamed piece; ``flush()`` at the
    end gives what was held back (a tag's possible beginning)."""

    def __init__(self, fmt: str, opened: bool = False, thinking: Thinking = THINK):
        self.start, self.end, self.repeats = thinking.start, thinking.end, thinking.repeats
        self._drop = Dropper(thinking.drop if fmt != "none" else ())
        self.split = fmt != "none"
        self.legacy = fmt == "deepseek-legacy"
        self.state = "think" if opened else "start"  # start: a <think> may still open the answer
        self._buf = ""

    def push(self, text: str) -> tuple[str, str]:
        reasoning, content = self._push(text)
        return reasoning, self._drop.push(content)

    def _push(self, text: str) -> tuple[str, str]:
        if not self.split:
            return "", text
        self._buf += text
        reasoning, content = "", ""
        while self._buf:
            if self.state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(self.start):
                    if self.legacy:
                        content += self._buf[: len(self._buf) - len(stripped) + len(self.start)]
                    self._buf, self.state = stripped[len(self.start) :].lstrip("\n"), "think"
                elif self.start.startswith(stripped):  # may still become the opening
                    break
                else:
                    self.state = "answer"
            elif self.state == "think":
                at = self._buf.find(self.end)
                if at < 0:
                    keep = held(self._buf, self.end)
                    piece, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                    reasoning += piece
                    content += piece if self.legacy else ""
                    break
                reasoning += self._buf[:at]
                content += self._buf[: at + len(self.end)] if self.legacy else ""
                self._buf, self.state = self._buf[at + len(self.end) :], "after"
            elif self.state == "after":  # the newlines that close a thought are not the answer's
                self._buf = self._buf.lstrip("\n")
                self.state = "answer" if self._buf else "after"
            elif self.repeats:  # a later thought opens in the answer (harmony: each analysis message)
                at = self._buf.find(self.start)
                if at < 0:
                    keep = held(self._buf, self.start)
                    content += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content += self._buf[: at + (len(self.start) if self.legacy else 0)]
                self._buf, self.state = self._buf[at + len(self.start) :], "think"
            else:
                content += self._buf
                self._buf = ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self.state == "think":
            return rest, self._drop.push(rest if self.legacy else "") + self._drop.flush()
        return "", self._drop.push(rest) + self._drop.flush()


class Dropper:
    """Content with a format's markers taken out, streamed: a text end that may begin a
    marker is held back until it does or does not."""

    def __init__(self, markers: tuple[str, ...]):
        self.markers = markers
        self._buf = ""

    def push(self, text: str) -> str:
        if not self.markers:
            return text
        self._buf += text
        for marker in self.markers:
            self._buf = self._buf.replace(marker, "")
        keep = max(held(self._buf, m) for m in self.markers)
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out

    def flush(self) -> str:
        rest, self._buf = self._buf, ""
        return rest
