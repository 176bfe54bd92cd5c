"""Slot contents in and out of memory, for slot files. Engine thread only: the
scheduler runs these between two steps (``Scheduler.call``), so a busy slot is read at
a step boundary and restore/erase run while the slot is idle."""

from __future__ import annotations

from engine.core.rope_switch import restored_keys, untagged
from engine.errors import SlotBusy
from engine.scheduling.task_board import TaskBoard
from memory import CacheFull, SeqState


class SlotNotReady(SlotBusy):
    """The slot is between states (a request is being set up in it); retry."""


def snapshot(board: TaskBoard, slot_id: int) -> tuple[list[int], SeqState, tuple[float, ...]]:
    """The tokens whose cache the slot holds now, that cache (copied), busy or idle, and
    the LoRA scales it was computed with."""
    slot = board.table.slots[slot_id]
    tokens = list(board.cached_tokens(slot))
    memory = board.engine.memory
    if memory.seq_pos_max(slot_id) + 1 != len(tokens):
        raise SlotNotReady(f"slot {slot_id} is being set up for a request; retry")
    return untagged(tokens), memory.save_seq(slot_id), slot.lora


def restore(board: TaskBoard, slot_id: int, tokens: list[int], state: SeqState, lora: tuple[float, ...] = ()) -> None:
    """Replace an idle slot's cache with ``state`` (``tokens``: one per cell).

    All or nothing: raises StateMismatch (shapes) with the slot unchanged. When blocks
    are short, idle caches of other slots are dropped least recently used first; if
    that is not enough, raises CacheFull (the slot unchanged).
    """
    slot, memory = board.table.slots[slot_id], board.engine.memory
    if slot.busy:  # Scheduler.call waits for an idle slot; a real check, not an assert (gone under -O)
        raise SlotBusy(f"slot {slot_id} is busy")
    while True:
        try:
            memory.load_seq(slot_id, state)
            break
        except CacheFull:
            others = sorted((s for s in board.table.idle if s is not slot and s.cached), key=lambda s: s.last_used)
            if not others:
                raise
            memory.seq_rm(others[0].id)
            others[0].cached = []
    slot.cached, slot.lora = restored_keys(list(tokens), board.engine.rope_switch), lora


def erase(board: TaskBoard, slot_id: int) -> int:
    """Drop an idle slot's cache; returns how many tokens it held."""
    slot = board.table.slots[slot_id]
    if slot.busy:
        raise SlotBusy(f"slot {slot_id} is busy")
    n = len(slot.cached)
    board.engine.memory.seq_rm(slot_id)
    slot.cached = []
    return n
