"""Incremental detokenization and stop strings.

``IncrementalDetokenizer`` decodes a short window of recent tokens and emits only
complete text: while the window ends in U+FFFD (half a UTF-8 character) it waits.
``StopMatcher`` holds back any text tail that could still grow into a stop string, so a
stop string split across tokens is found and never emitted.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

_CONTEXT = 5  # prompt tokens decoded with the first output (leading-space rules)


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special: bool = True, keep: frozenset[int] = frozenset()) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Decoder, prompt_ids: list[int], skip_special: bool = True, keep: frozenset[int] = frozenset()
    ):
        """``skip_special``: special tokens decode to nothing (else to their text), but
        those in ``keep`` (a chat family's markers) decode to their text."""
        self.tok, self.skip_special, self.keep = tokenizer, skip_special, keep
        self.ids = list(prompt_ids[-_CONTEXT:])
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        if self.keep:
            return self.tok.decode(ids, self.skip_special, self.keep)
        return self.tok.decode(ids, self.skip_special)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (may be empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Text still held back (an incomplete character, decoded with replacement)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopResult(NamedTuple):
    text: str  # safe to emit now
    stop: str | None  # the stop string found, if any


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, delta: str) -> StopResult:
        text = self.pending + delta
        found = [(text.find(s), s) for s in self.stops if s in text]
        if found:
            idx, stop = min(found)
            self.pending = ""
            return StopResult(text[:idx], stop)
        hold = self._partial_tail(text)
        self.pending = text[len(text) - hold :] if hold else ""
        return StopResult(text[: len(text) - hold], None)

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text

    def _partial_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
