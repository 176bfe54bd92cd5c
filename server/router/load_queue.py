"""The line of requests waiting for a model that is not loaded (llama-server's LRU
scheduler): one entry per model, first come first served.

Requests for the same model share its entry, so many of them cost one load and one
eviction. The head entry (the first whose model still needs starting: ``needs_room``,
from the child's state) loads its model when the ``--models-max`` limit leaves room; an
entry stays in the line until its last waiter has its model (or leaves), and a model
with waiters in the line is never the one stopped to make room."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Waiting:
    name: str
    waiters: int = 1
    since: float = field(default_factory=time.monotonic)  # when its first waiter came


class LoadQueue:
    def __init__(self) -> None:
        self.entries: list[Waiting] = []

    def join(self, name: str) -> Waiting:
        """The model's entry, one waiter more (a new entry at the back if it had none)."""
        for entry in self.entries:
            if entry.name == name:
                entry.waiters += 1
                return entry
        self.entries.append(Waiting(name))
        return self.entries[-1]

    def leave(self, entry: Waiting) -> None:
        """One waiter fewer; the entry goes with its last one."""
        entry.waiters -= 1
        if entry.waiters <= 0 and entry in self.entries:
            self.entries.remove(entry)

    def first(self, needs_room: Callable[[str], bool]) -> Waiting | None:
        """The first entry whose model still needs starting."""
        return next((e for e in self.entries if needs_room(e.name)), None)

    def wants(self, name: str) -> bool:
        return any(e.name == name for e in self.entries)

    def needed(self, needs_room: Callable[[str], bool], waited: float = 0.0) -> int:
        """Models the line still needs room for (those being started or running hold
        theirs), counting only entries that have waited ``waited`` seconds or more."""
        now = time.monotonic()
        return sum(1 for e in self.entries if needs_room(e.name) and now - e.since >= waited)
