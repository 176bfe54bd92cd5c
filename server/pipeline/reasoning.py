"""The reasoning split of chat answers (llama-server's ``--reasoning-format``): text
between ``<think>`` and ``</think>`` goes to ``reasoning_content``, the rest to
``content``, whole or streamed.

Formats: ``none`` leaves the text as generated; ``deepseek`` (and ``auto``, the
default) splits; ``deepseek-legacy`` splits but also keeps the tags and the thought in
``content``. A prompt that ends inside an opened ``<think>`` (Qwen3 and DeepSeek-R1
templates open it for the model) starts the answer in the reasoning part.
"""

from __future__ import annotations

FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
START, END = "<think>", "</think>"


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt leaves a <think> block open for the model (the
    template opened it, or a prefilled assistant message is inside one)."""
    return prompt.rfind(START) > prompt.rfind(END)


def held(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (may complete later)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """``push(text) -> (reasoning, content)`` for each streamed piece; ``flush()`` at the
    end gives what was held back (a tag's possible beginning)."""

    def __init__(self, fmt: str, opened: bool = False):
        self.split = fmt != "none"
        self.legacy = fmt == "deepseek-legacy"
        self.state = "think" if opened else "start"  # start: a <think> may still open the answer
        self._buf = ""

    def push(self, text: str) -> tuple[str, str]:
        if not self.split:
            return "", text
        self._buf += text
        reasoning, content = "", ""
        while self._buf:
            if self.state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(START):
                    if self.legacy:
                        content += self._buf[: len(self._buf) - len(stripped) + len(START)]
                    self._buf, self.state = stripped[len(START) :].lstrip("\n"), "think"
                elif START.startswith(stripped):  # may still become <think>
                    break
                else:
                    self.state = "answer"
            elif self.state == "think":
                at = self._buf.find(END)
                if at < 0:
                    keep = held(self._buf, END)
                    piece, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                    reasoning += piece
                    content += piece if self.legacy else ""
                    break
                reasoning += self._buf[:at]
                content += self._buf[: at + len(END)] if self.legacy else ""
                self._buf, self.state = self._buf[at + len(END) :], "after"
            elif self.state == "after":  # the newlines that close a thought are not the answer's
                self._buf = self._buf.lstrip("\n")
                self.state = "answer" if self._buf else "after"
            else:
                content += self._buf
                self._buf = ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self.state == "think":
            return rest, rest if self.legacy else ""
        return "", rest
