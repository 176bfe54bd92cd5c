"""Requests on their slots: admission, prefix reuse, the fan-out of n choices, step
events turned into request events, cancellation and failure.

Engine thread only (the Scheduler calls it between steps). Owns no tensors and no
threads: it asks the engine and its memory, and hands events to ``emit``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.engine import Engine
from engine.core.sequence import Sequence, StepEvent
from engine.prompt_cache.ram_tier import PromptCache, shared_prefix
from engine.scheduling.prefix_reuse import PrefixReuse
from engine.scheduling.request import Admitted, Delta, Failed, Progress, Request, RequestEnd, RequestEvent
from engine.scheduling.slots import Slot, SlotTable, common_prefix, lora_key

WAIT_FOR_SHARED = 64  # tokens of a start being computed elsewhere worth waiting for (see _shared_start_in_flight)

log = logging.getLogger("slotserve.scheduler")
Sink = Callable[[RequestEvent], None]
STEP_FAULT = Failed("internal error in the engine step", "server_error", 500)


@dataclass(eq=False)
class Task:
    req: Request
    sink: Sink
    slots: list[Slot] = dataclasses.field(default_factory=list)
    seqs: list[Sequence | None] = dataclasses.field(default_factory=list)
    n_done: int = 0
    n_cached: int = 0  # prompt tokens reused from the cache
    t_admit: float | None = None
    t_first: float | None = None  # the first token of any choice
    ended: bool = False  # told to ``on_end`` (once)


class TaskBoard(PrefixReuse):
    def __init__(
        self,
        engine: Engine,
        table: SlotTable,
        emit: Callable[[Task, RequestEvent], None],
        on_end: Callable[[RequestEnd], None] | None = None,
        prompt_cache: PromptCache | None = None,
        cache_idle_slots: bool = True,
    ):
        """``on_end`` hears of every task's end (on this thread), before its last slot
        is released. ``prompt_cache``: where an idle slot's state goes before the slot is
        taken for another prompt (``cache_idle_slots``), and where prompts look for a
        longer prefix than the slots hold."""
        self.engine = engine
        self.table = table
        self.emit = emit
        self.on_end = on_end
        self.prompt_cache = prompt_cache if prompt_cache is not None and prompt_cache.enabled else None
        self.cache_idle_slots = cache_idle_slots
        self.n_pool_tokens = 0  # prompt tokens taken from blocks the pool kept by hash (engine thread; racy reads)
        self.waiting: deque[Task] = deque()
        self.active: dict[int, Task] = {}  # by request id
        self._by_seq: dict[Sequence, tuple[Task, int]] = {}

    def admittable(self) -> bool:
        return any(self._choose(t) is not None for t in self.waiting)

    def _choose(self, task: Task) -> list[Slot] | None:
        req = task.req
        if req.cache_prompt and self._shared_start_in_flight(req.keys):
            return None  # wait: it will be copied from that slot instead of computed twice
        first = self.table.choose(req.keys, req.id_slot)
        if first is None or not self._cache_ready(req):
            return None
        others = [s for s in sorted(self.table.idle, key=lambda s: s.last_used) if s is not first.slot]
        if len(others) < req.n - 1:
            return None
        return [first.slot, *others[: req.n - 1]]

    def _cache_ready(self, req) -> bool:
        """False while the prompt cache's disk tier reads the entry this request would
        restore (off the engine thread; the request waits, the others run)."""
        cache = self.prompt_cache
        if (
            cache is None
            or cache.disk is None
            or not req.cache_prompt
            or lora_key(req.lora)
            or req.pooling not in (None, "last", "rank")
        ):
            return True
        n_have = max(shared_prefix(self.cached_tokens(slot), req.keys) for slot in self.table.slots)
        return cache.ready(req.keys, n_have, self.engine.memory.cuts_anywhere)

    def _shared_start_in_flight(self, prompt: list[int]) -> bool:
        """Whether a running prompt's prefill is computing a start this prompt shares,
        at least ``WAIT_FOR_SHARED`` tokens longer than any cache holds now (many users
        arriving together with one system prompt: the first computes it, the others
        copy it; without the wait each slot would compute it at once)."""
        running = [self.seq_of(slot) for slot in self.table.slots if slot.busy]
        prefilling = [task.req.keys for task, seq in running if seq is not None and seq.n_pending > 1]
        computing = max((shared_prefix(p, prompt) for p in prefilling), default=0)
        if computing < WAIT_FOR_SHARED:  # (the usual case: no compare against every slot's cache)
            return False
        have = max(shared_prefix(self.cached_tokens(slot), prompt) for slot in self.table.slots)
        return computing - have >= WAIT_FOR_SHARED

    def admit(self) -> int:
        """Start every waiting task that has its slots now; returns how many started."""
        n = 0
        for task in list(self.waiting):
            slots = self._choose(task)
            if slots is None:
                continue
            self.waiting.remove(task)
            self._start(task, slots)
            n += 1
        return n

    def _start(self, task: Task, slots: list[Slot]) -> None:
        req, key = task.req, lora_key(task.req.lora)
        for i, slot in enumerate(slots):
            same = slot.lora == key  # a cache computed with other LoRA scales is nobody's prefix
            keeps = common_prefix(slot.cached, req.keys) if i == 0 and req.cache_prompt and same else 0
            if keeps < len(slot.cached) / 2:  # most of what the slot holds is about to go: kept in host RAM
                self._save_idle(slot)  # (llama-server's rule; a turn that rewrites the end of one is not saved)
            self.table.take(slot, req.id)
        task.slots, task.seqs = slots, [None] * req.n
        self.active[req.id] = task
        reuses = req.cache_prompt and req.pooling in (None, "last", "rank")  # others need every hidden state
        n_cached = self._reuse_prefix(slots[0], req, key) if reuses else 0
        for slot in slots:
            slot.lora = key
        try:
            args = (req.n_keep, req.pooling, req.lora, req.media, req.turn_start)
            seq = self.engine.add_sequence(req.prompt_ids, req.params, slots[0].id, n_cached, *args)
        except ValueError as exc:  # validated before queueing; kept as a guard
            self.fail(task, Failed(str(exc), "invalid_request_error", 400))
            return
        self._track(task, 0, seq)
        task.n_cached, task.t_admit = seq.n_computed, time.monotonic()
        self.emit(task, Admitted([s.id for s in slots], len(req.prompt_ids), seq.n_computed, task.t_admit))
        if req.progress:  # llama-server's first update: before any prompt token is computed
            self._progress(task, seq, task.t_admit)

    def _save_idle(self, slot: Slot) -> None:
        if self.prompt_cache is not None and self.cache_idle_slots and not slot.lora:
            self.prompt_cache.save_slot(self.engine.memory, slot)

    def cached_tokens(self, slot: Slot) -> list[int]:
        """Tokens whose cache the slot holds: its idle cache, or a running choice's computed tokens."""
        if not slot.busy:
            return slot.cached
        _, seq = self.seq_of(slot)
        return seq.keys[: seq.n_computed] if seq else []

    def _track(self, task: Task, index: int, seq: Sequence) -> None:
        task.seqs[index] = seq
        self._by_seq[seq] = (task, index)

    def dispatch(self, events: list[StepEvent]) -> int:
        """Turn one step's events into request events (and fan-outs, slot releases).
        A sequence the step failed for, or whose event raises here, fails its request
        alone (500); returns how many requests failed so."""
        n_failed = 0
        for event in events:
            task, _ = self._by_seq.get(event.seq, (None, 0))
            error = event.error
            if error is None:
                try:
                    self._dispatch(event)
                    continue
                except Exception as exc:
                    error = exc
            n_failed += 1
            log.error("a request failed in its engine step: %s: %s", type(error).__name__, error, exc_info=error)
            if task is not None and not task.ended:
                self.fail(task, STEP_FAULT)
        return n_failed

    def fail_all(self, failure: Failed) -> None:
        """Fail every running request."""
        for task in list(self.active.values()):
            self.fail(task, failure)

    def fail_waiting(self, failure: Failed) -> int:
        """Fail every request still waiting for a slot; returns how many."""
        n = len(self.waiting)
        while self.waiting:
            task = self.waiting.popleft()
            self._report(task, "error")
            self.emit(task, failure)
        return n

    def seq_of(self, slot: Slot) -> tuple[Task | None, Sequence | None]:
        """The task using ``slot`` and that choice's sequence (None, None when idle)."""
        task = self.active.get(slot.id_task) if slot.id_task is not None else None
        if task is None or slot not in task.slots:
            return task, None
        return task, task.seqs[task.slots.index(slot)]

    def _dispatch(self, event: StepEvent) -> None:
        task, index = self._by_seq.get(event.seq, (None, 0))
        if task is None:
            return
        seq = event.seq  # (its state after the whole step: a step may bring several tokens, one event each)
        if task.req.progress and index == 0 and (event.token_id is None or event.n_output == 1):
            self._progress(task, seq)
        if event.token_id is None and not event.finished:
            return
        if index == 0 and task.req.n > 1 and event.n_output <= 1 and task.seqs[1] is None:
            self._fan_out(task, seq)
        reason = seq.finish_reason.value if event.finished else None
        delta = Delta(index, event.token_id, event.text, event.logprob, event.finished, time.monotonic(), reason)
        if event.token_id is not None and task.t_first is None:
            task.t_first = delta.t
        delta.stop_word, delta.n_generated = seq.stop_string, event.n_output
        delta.n_drafted, delta.n_draft_accepted = seq.n_drafted, seq.n_draft_accepted
        delta.truncated, delta.embedding = seq.n_shifted > 0, event.embedding
        self.emit(task, delta)
        if event.finished:
            self._end_choice(task, index)

    def _progress(self, task: Task, seq: Sequence, t: float | None = None) -> None:
        n_total = len(task.req.prompt_ids)
        n_done = min(seq.n_computed, n_total)
        self.emit(task, Progress(n_total, task.n_cached, n_done, time.monotonic() if t is None else t))

    def _fan_out(self, task: Task, first: Sequence) -> None:
        """n > 1: the prompt was computed once in the first slot; share it with the others."""
        req, n_prompt = task.req, len(task.req.prompt_ids)
        for i, slot in enumerate(task.slots[1:], start=1):
            self.engine.memory.seq_cp(first.seq_id, slot.id, 0, n_prompt)
            seed = None if req.params.seed is None else req.params.seed + i
            params = dataclasses.replace(req.params, seed=seed)
            seq = self.engine.add_sequence(
                req.prompt_ids, params, slot.id, n_prompt - 1, req.n_keep, lora=req.lora, media=req.media
            )
            self._track(task, i, seq)

    def _end_choice(self, task: Task, index: int) -> None:
        seq = task.seqs[index]
        self._by_seq.pop(seq, None)
        task.n_done += 1
        if task.n_done == task.req.n:  # counted before the slot turns idle
            self.active.pop(task.req.id, None)
            self._report(task, _outcome(task))
        slot = task.slots[index]
        self.table.release(slot, seq.keys[: seq.n_computed])
        if not slot.lora:  # its whole blocks outlive the slot's cache (base-model caches only: keyed by tokens)
            self.engine.memory.publish_prefix(slot.id, slot.cached)

    def _report(self, task: Task, outcome: str) -> None:
        if task.ended or self.on_end is None:
            task.ended = True
            return
        task.ended = True
        n_generated = sum(len(s.output_ids) for s in task.seqs if s is not None)
        req, t_end = task.req, time.monotonic()
        seqs = [s for s in task.seqs if s is not None]
        end = RequestEnd(
            outcome,
            len(req.prompt_ids),
            task.n_cached,
            n_generated,
            req.t_arrival,
            task.t_admit,
            task.t_first,
            t_end,
            n_drafted=sum(s.n_drafted for s in seqs),
            n_draft_accepted=sum(s.n_draft_accepted for s in seqs),
            n_drafts=sum(s.n_drafts for s in seqs),
        )
        try:
            self.on_end(end)
        except Exception:  # a broken listener must not break the board
            log.exception("request-end listener failed")

    def cancel(self, id_task: int) -> int:
        """Drop the task, waiting or running (its slots keep their caches); returns how
        many waiting tasks were removed (0 or 1)."""
        n = 0
        for task in list(self.waiting):
            if task.req.id == id_task:
                self.waiting.remove(task)
                self._report(task, "abort")
                n += 1
        task = self.active.pop(id_task, None)
        if task is not None:
            self._report(task, "abort")
            self._release_all(task)
        return n

    def _release_all(self, task: Task) -> None:
        for slot, seq in zip(task.slots, task.seqs):
            if seq is None:
                self.table.release(slot, [])
                self.engine.memory.seq_rm(slot.id)
                continue
            if seq.finished and seq not in self._by_seq:
                continue  # this choice already ended and released its slot
            self.engine.abort(seq)
            self._by_seq.pop(seq, None)
            self.table.release(slot, seq.keys[: seq.n_computed])
        self.active.pop(task.req.id, None)

    def fail_seqs(self, seqs: list[Sequence], failure: Failed) -> None:
        """Fail the requests these sequences belong to (their caches are dropped)."""
        tasks = {id(t): t for t, _ in (self._by_seq.get(s, (None, 0)) for s in seqs) if t is not None}
        for task in tasks.values():
            self.fail(task, failure)

    def fail(self, task: Task, failure: Failed) -> None:
        self._report(task, "error")
        self._release_all(task)
        for slot in task.slots:  # the cache of a failed request is not trusted for reuse
            if not slot.busy:
                self.engine.memory.seq_rm(slot.id)
                slot.cached = []
        self.emit(task, failure)

    def make_room(self) -> None:
        """The step needed more blocks than are free: drop idle caches (least recently
        used first); when none is left, fail the newest running request."""
        idle = sorted((s for s in self.table.idle if s.cached), key=lambda s: s.last_used)
        if idle:
            self._save_idle(idle[0])  # kept in host RAM, if there is a prompt cache
            self.engine.memory.seq_rm(idle[0].id)
            idle[0].cached = []
            return
        newest = max(self.active.values(), key=lambda t: t.req.id, default=None)
        if newest is not None:
            log.warning("KV cache full: failing request %d", newest.req.id)
            self.fail(newest, Failed("the KV cache is full; retry later", "unavailable_error", 503))


def _outcome(task: Task) -> str:
    """stop or length: the first choice's reason; abort when a choice did not finish."""
    reasons = [s.finish_reason.value if s is not None and s.finish_reason else None for s in task.seqs]
    return reasons[0] if None not in reasons and reasons[0] in ("stop", "length") else "abort"
