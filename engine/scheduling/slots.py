"""Slots: the fixed set of sequences the server hands to requests.

Slot ``i`` is memory sequence ``i``. The table keeps, per slot, the tokens whose cache
memory holds (so a new prompt can reuse the longest common prefix) and whether a
request is using it. It owns no tensors and never touches memory itself.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def lora_key(scales: tuple[float, ...]) -> tuple[float, ...]:
    """LoRA scales as a cache key: trailing zeros dropped, so () is the base model."""
    scales = tuple(float(s) for s in scales)
    while scales and scales[-1] == 0:
        scales = scales[:-1]
    return scales


@dataclass(eq=False)
class Slot:
    id: int
    cached: list[int] = field(default_factory=list)  # tokens memory holds for this slot (idle slots)
    id_task: int | None = None  # the request using it; None when idle
    last_used: int = 0
    restored: tuple[str, int] | None = None  # its latest prompt's start from the prompt cache: tier, tokens
    lora: tuple[float, ...] = ()  # the LoRA scales its cache was computed with (lora_key; (): none)

    @property
    def busy(self) -> bool:
        return self.id_task is not None


class SlotChoice(NamedTuple):
    slot: Slot
    n_reuse: int  # prompt tokens already in the slot's own cache


class SlotTable:
    """Assignment rules (llama-server's, except that an out-of-range id is an error):
    a pinned ``id_slot`` when it is idle; otherwise the idle slot whose cache shares the
    longest prefix with the prompt when ``prefix / len(prompt)`` exceeds ``similarity``;
    otherwise the least recently used idle slot."""

    def __init__(self, n_slots: int, similarity: float = 0.1):
        self.slots = [Slot(i) for i in range(n_slots)]
        self.similarity = similarity
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def idle(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def choose(self, prompt: list[int], id_slot: int | None = None) -> SlotChoice | None:
        """The slot for ``prompt``, or None when the pinned slot (or every slot) is busy.
        Does not reserve it: call ``take``."""
        if id_slot is not None:
            slot = self.slots[id_slot]
            return None if slot.busy else SlotChoice(slot, common_prefix(slot.cached, prompt))
        idle = self.idle
        if not idle:
            return None
        best = max(idle, key=lambda s: (common_prefix(s.cached, prompt), -s.last_used))
        n = common_prefix(best.cached, prompt)
        if prompt and n / len(prompt) > self.similarity:
            return SlotChoice(best, n)
        lru = min(idle, key=lambda s: s.last_used)
        return SlotChoice(lru, common_prefix(lru.cached, prompt))

    def take(self, slot: Slot, id_task: int) -> None:
        if slot.busy:
            raise ValueError(f"slot {slot.id} is busy")
        slot.id_task = id_task
        slot.last_used = next(self._clock)

    def release(self, slot: Slot, cached: list[int]) -> None:
        """The request is done; memory now holds ``cached`` for this slot."""
        slot.id_task = None
        slot.cached = list(cached)
        slot.last_used = next(self._clock)
