"""llama-server's reasoning budget (``--reasoning-budget N``, a chat request's
``reasoning_budget_tokens``): at most N tokens inside a thinking block, then the block
is closed by forcing an optional message and the end tag, token by token.

Per sequence, llama.cpp's states: idle (waiting for a start tag) -> counting (N tokens
left; an end tag written by the model ends the block: done) -> waiting for a token that
ends a UTF-8 character, when the budget runs out in the middle of one -> forcing (each
row's logits are -inf but the next forced token's) -> done (a new start tag counts
again). A prompt that leaves a block open (the template opened it) starts counting."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetSpec:
    tokens: int  # the budget (0: close at once)
    start: tuple[int, ...]  # the start tag's tokens
    ends: tuple[tuple[int, ...], ...]  # end tags' tokens: any closes the block
    forced: tuple[int, ...]  # the message and an end tag, forced when the budget is spent
    opened: bool = False  # the prompt leaves a block open: counting from the first token


def utf8_complete(piece: bytes) -> bool:
    """Whether ``piece`` does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): how long its character is
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back >= need
    return True


class ReasoningBudget:
    IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = range(5)

    def __init__(self, spec: BudgetSpec):
        self.spec = spec
        self.recent: list[int] = []  # the latest tokens, for the tags that span several
        self.keep = max(len(spec.start), *(len(e) for e in spec.ends), 1)  # ... this many of them
        self.state, self.left, self.at = self.IDLE, spec.tokens, 0
        if spec.opened:
            self._open()

    def forced(self) -> int | None:
        """The token the next row must be (None: free)."""
        return self.spec.forced[self.at] if self.state == self.FORCING and self.at < len(self.spec.forced) else None

    def accept(self, token: int, complete: bool) -> None:
        """``token`` was output; ``complete``: it ends a UTF-8 character."""
        self.recent = [*self.recent[len(self.recent) + 1 - self.keep :], token]
        if self.state in (self.IDLE, self.DONE):
            if self._ends_with((self.spec.start,)):
                self._open()
        elif self.state in (self.COUNTING, self.WAITING_UTF8):
            if self._ends_with(self.spec.ends):
                self.state = self.DONE
            elif self.state == self.WAITING_UTF8 or self._spend():
                self._force_when(complete)
        elif self.state == self.FORCING:
            self.at += 1
            if self.at >= len(self.spec.forced):
                self.state = self.DONE

    def _open(self) -> None:
        self.recent, self.left = [], self.spec.tokens
        self.state = self.COUNTING
        if self.left <= 0:
            self.state, self.at = self.FORCING, 0

    def _spend(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def _force_when(self, complete: bool) -> None:
        self.state = self.FORCING if complete else self.WAITING_UTF8
        self.at, self.recent = 0, []

    def _ends_with(self, seqs) -> bool:
        hit = any(s and self.recent[-len(s) :] == list(s) for s in seqs)
        if hit:
            self.recent = []
        return hit
