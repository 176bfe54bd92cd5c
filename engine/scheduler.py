"""The scheduler: one engine thread that puts requests into slots and steps the engine.

Thread contract: ``submit``, ``cancel``, ``call``, ``snapshot`` and ``health`` may be
called from any thread (the asyncio side); everything else, and every engine or memory
call, runs on the engine thread. Events go back through the ``sink`` given to
``submit``. Without a ``loop``, sinks are called on the engine thread. With a ``loop``,
the events of one loop turn are handed over in one ``loop.call_soon_threadsafe`` and
the sinks run on that loop (one wake-up per step instead of one per token), so a sink
may be ``asyncio.Queue.put_nowait``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.engine import Engine
from engine.request import Admitted, Delta, Failed, QueueFull, Request, RequestError, RequestEvent
from engine.sequence import Sequence, StepEvent
from engine.slots import Slot, SlotTable, common_prefix
from memory import CacheFull

log = logging.getLogger("slotserve.scheduler")
Sink = Callable[[RequestEvent], None]


@dataclass(eq=False)
class _Task:
    req: Request
    sink: Sink
    slots: list[Slot] = dataclasses.field(default_factory=list)
    seqs: list[Sequence | None] = dataclasses.field(default_factory=list)
    n_done: int = 0


@dataclass(frozen=True)
class SlotInfo:
    id: int
    n_ctx: int
    is_processing: bool
    id_task: int | None
    n_prompt_tokens: int
    n_cached: int
    n_decoded: int
    params: dict


@dataclass(frozen=True)
class Health:
    alive: bool
    stalled: bool
    n_waiting: int
    n_running: int


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        similarity: float = 0.1,
        max_queue: int = 256,
        stall_timeout: float = 60.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.engine = engine
        self.loop = loop
        self._outbox: list[tuple[Sink, RequestEvent]] = []  # engine thread only
        self.table = SlotTable(engine.config.n_seq_max, similarity)
        self.max_queue = max_queue
        self.stall_timeout = stall_timeout
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._inbox: deque[_Task] = deque()  # new tasks (guarded by _cv)
        self._cancels: set[int] = set()  # guarded by _cv
        self._calls: deque[tuple[Callable, concurrent.futures.Future]] = deque()  # guarded by _cv
        self._n_waiting = 0  # queued, not yet in a slot (guarded by _cv)
        self._waiting: deque[_Task] = deque()  # engine thread only
        self._active: dict[int, _Task] = {}  # engine thread only
        self._by_seq: dict[Sequence, tuple[_Task, int]] = {}
        self._stop = False
        self._busy_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="slotserve-engine", daemon=True)

    # ---- any thread ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def validate(self, req: Request) -> None:
        """Raise RequestError for what can never run (independent of load)."""
        n_slots, n_ctx = len(self.table), self.engine.n_ctx_seq
        if req.id_slot is not None and not 0 <= req.id_slot < n_slots:
            raise RequestError(f"id_slot {req.id_slot} out of range [0, {n_slots})", code="invalid_id_slot")
        if not 1 <= req.n <= n_slots:
            raise RequestError(f"n must be in [1, {n_slots}] (the number of slots)", code="invalid_n")
        if not req.prompt_ids:
            raise RequestError("the prompt is empty")
        vocab = self.engine.model_config.vocab_size
        if min(req.prompt_ids) < 0 or max(req.prompt_ids) >= vocab:
            raise RequestError(f"token ids must be in [0, {vocab})")
        n_prompt = len(req.prompt_ids)
        n_need = n_prompt + (req.params.max_tokens if req.max_tokens_given else 0)
        if n_prompt >= n_ctx or (n_need > n_ctx and not self.engine.config.context_shift):
            raise RequestError(
                f"the request needs {n_need} tokens ({n_prompt} prompt) but the slot's context is {n_ctx}",
                "exceed_context_size_error",
                n_prompt_tokens=n_prompt,
                n_ctx=n_ctx,
            )

    def submit(self, req: Request, sink: Sink) -> int:
        """Queue ``req``; returns its id. Raises RequestError or QueueFull."""
        self.validate(req)
        with self._cv:
            if self._n_waiting >= self.max_queue + len(self.table.idle):  # idle slots admit at once
                raise QueueFull(f"{self._n_waiting} requests are waiting (--max-queue {self.max_queue})")
            req.id = next(self._ids)
            self._n_waiting += 1
            self._inbox.append(_Task(req, sink))
            self._cv.notify()
        return req.id

    def cancel(self, id_task: int) -> None:
        with self._cv:
            self._cancels.add(id_task)
            self._cv.notify()

    async def call(self, fn: Callable[[], object]) -> object:
        """Run ``fn()`` on the engine thread between two steps (where memory may be
        read or changed safely) and return its result or raise its exception."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stop or not self._thread.is_alive():
                raise RuntimeError("the engine thread is not running")
            self._calls.append((fn, future))
            self._cv.notify()
        return await asyncio.wrap_future(future)

    def health(self) -> Health:
        busy = self._busy_since
        stalled = busy is not None and time.monotonic() - busy > self.stall_timeout
        return Health(self._thread.is_alive(), stalled, self._n_waiting, len(self._active))

    def snapshot(self) -> list[SlotInfo]:
        """Per-slot state for /slots (a racy read, good enough for monitoring)."""
        out = []
        for slot in self.table.slots:
            task = self._active.get(slot.id_task) if slot.id_task is not None else None
            seq = None
            if task is not None and slot in task.slots:
                seq = task.seqs[task.slots.index(slot)]
            params = dataclasses.asdict(task.req.params) if task else {}
            out.append(
                SlotInfo(
                    id=slot.id,
                    n_ctx=self.engine.n_ctx_seq,
                    is_processing=slot.busy,
                    id_task=slot.id_task,
                    n_prompt_tokens=len(task.req.prompt_ids) if task else 0,
                    n_cached=seq.n_computed if seq else len(slot.cached),
                    n_decoded=len(seq.output_ids) if seq else 0,
                    params=params,
                )
            )
        return out

    # ---- engine thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._has_news():
                    self._busy_since = None
                    self._cv.wait()
                if self._stop:
                    break
                self._waiting.extend(self._inbox)
                self._inbox.clear()
                cancels, self._cancels = self._cancels, set()
                calls, self._calls = self._calls, deque()
            self._busy_since = self._busy_since or time.monotonic()
            for id_task in cancels:
                self._cancel(id_task)
            for fn, future in calls:
                self._run_call(fn, future)
            self._admit()
            if self.engine.has_work:
                self._step()
                self._busy_since = time.monotonic()
            self._flush()
        for task in list(self._active.values()):
            self._fail(task, Failed("the server is shutting down", "unavailable_error", 503))
        self._flush()
        for _, future in self._calls:
            future.set_exception(RuntimeError("the engine thread stopped"))

    def _emit(self, task: _Task, event: RequestEvent) -> None:
        self._outbox.append((task.sink, event))

    def _flush(self) -> None:
        batch, self._outbox = self._outbox, []
        if not batch:
            return
        if self.loop is None:
            _deliver(batch)
            return
        try:
            self.loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    @staticmethod
    def _run_call(fn: Callable, future: concurrent.futures.Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except Exception as exc:  # handed to the caller
            future.set_exception(exc)

    def _has_news(self) -> bool:
        queued = self._stop or self._inbox or self._cancels or self._calls
        return bool(queued) or self.engine.has_work or self._admittable()

    def _admittable(self) -> bool:
        return any(self._choose(t) is not None for t in self._waiting)

    def _choose(self, task: _Task) -> list[Slot] | None:
        req = task.req
        first = self.table.choose(req.prompt_ids, req.id_slot)
        if first is None:
            return None
        others = [s for s in sorted(self.table.idle, key=lambda s: s.last_used) if s is not first.slot]
        if len(others) < req.n - 1:
            return None
        return [first.slot, *others[: req.n - 1]]

    def _admit(self) -> None:
        for task in list(self._waiting):
            slots = self._choose(task)
            if slots is None:
                continue
            self._waiting.remove(task)
            with self._cv:
                self._n_waiting -= 1
            self._start(task, slots)

    def _start(self, task: _Task, slots: list[Slot]) -> None:
        req = task.req
        for slot in slots:
            self.table.take(slot, req.id)
        task.slots, task.seqs = slots, [None] * req.n
        self._active[req.id] = task
        n_cached = self._reuse_prefix(slots[0], req) if req.cache_prompt else 0
        try:
            seq = self.engine.add_sequence(req.prompt_ids, req.params, slots[0].id, n_cached, req.n_keep)
        except ValueError as exc:  # validated before queueing; kept as a guard
            self._fail(task, Failed(str(exc), "invalid_request_error", 400))
            return
        self._track(task, 0, seq)
        self._emit(task, Admitted([s.id for s in slots], len(req.prompt_ids), seq.n_computed, time.monotonic()))

    def _reuse_prefix(self, slot: Slot, req: Request) -> int:
        """Tokens of the prompt the slot holds after keeping its own prefix or copying a
        longer one from another slot (busy or idle)."""
        prompt = req.prompt_ids
        own = common_prefix(slot.cached, prompt)
        best, n_best = None, own
        for other in self.table.slots:
            if other is slot:
                continue
            n = common_prefix(self._cached_tokens(other), prompt)
            if n > n_best:
                best, n_best = other, n
        if best is None:
            return own
        try:
            self.engine.memory.seq_cp(best.id, slot.id, 0, n_best)
        except CacheFull:
            return 0  # seq_cp replaced nothing; the slot may still hold its own prefix, but be safe
        slot.cached = prompt[:n_best]
        return n_best

    def _cached_tokens(self, slot: Slot) -> list[int]:
        if not slot.busy:
            return slot.cached
        task = self._active.get(slot.id_task)
        if task is None or slot not in task.slots:
            return []
        seq = task.seqs[task.slots.index(slot)]
        return seq.tokens[: seq.n_computed] if seq else []

    def _track(self, task: _Task, index: int, seq: Sequence) -> None:
        task.seqs[index] = seq
        self._by_seq[seq] = (task, index)

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except CacheFull:
            self._make_room()
            return
        except Exception:  # a bug, not client input: fail what ran, keep serving
            log.exception("engine step failed")
            for task in list(self._active.values()):
                self._fail(task, Failed("internal error in the engine step", "server_error", 500))
            return
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: StepEvent) -> None:
        task, index = self._by_seq.get(event.seq, (None, 0))
        if task is None or event.token_id is None and not event.finished:
            return
        seq = event.seq
        if index == 0 and task.req.n > 1 and len(seq.output_ids) <= 1 and task.seqs[1] is None:
            self._fan_out(task, seq)
        logprob = seq.logprobs[-1] if event.token_id is not None and seq.logprobs else None
        reason = seq.finish_reason.value if event.finished else None
        delta = Delta(index, event.token_id, event.text, logprob, event.finished, time.monotonic(), reason)
        delta.stop_word, delta.n_generated = seq.stop_string, len(seq.output_ids)
        self._emit(task, delta)
        if event.finished:
            self._end_choice(task, index)

    def _fan_out(self, task: _Task, first: Sequence) -> None:
        """n > 1: the prompt was computed once in the first slot; share it with the others."""
        req, n_prompt = task.req, len(task.req.prompt_ids)
        for i, slot in enumerate(task.slots[1:], start=1):
            self.engine.memory.seq_cp(first.seq_id, slot.id, 0, n_prompt)
            seed = None if req.params.seed is None else req.params.seed + i
            params = dataclasses.replace(req.params, seed=seed)
            self._track(task, i, self.engine.add_sequence(req.prompt_ids, params, slot.id, n_prompt - 1, req.n_keep))

    def _end_choice(self, task: _Task, index: int) -> None:
        seq = task.seqs[index]
        self._by_seq.pop(seq, None)
        self.table.release(task.slots[index], seq.tokens[: seq.n_computed])
        task.n_done += 1
        if task.n_done == task.req.n:
            self._active.pop(task.req.id, None)

    def _cancel(self, id_task: int) -> None:
        for task in list(self._waiting):
            if task.req.id == id_task:
                self._waiting.remove(task)
                with self._cv:
                    self._n_waiting -= 1
        task = self._active.pop(id_task, None)
        if task is not None:
            self._release_all(task)

    def _release_all(self, task: _Task) -> None:
        for slot, seq in zip(task.slots, task.seqs):
            if seq is None:
                self.table.release(slot, [])
                self.engine.memory.seq_rm(slot.id)
                continue
            if seq.finished and seq not in self._by_seq:
                continue  # this choice already ended and released its slot
            self.engine.abort(seq)
            self._by_seq.pop(seq, None)
            self.table.release(slot, seq.tokens[: seq.n_computed])
        self._active.pop(task.req.id, None)

    def _fail(self, task: _Task, failure: Failed) -> None:
        self._release_all(task)
        for slot in task.slots:  # the cache of a failed request is not trusted for reuse
            if not slot.busy:
                self.engine.memory.seq_rm(slot.id)
                slot.cached = []
        self._emit(task, failure)

    def _make_room(self) -> None:
        """The step needed more blocks than are free: drop idle caches (least recently
        used first); when none is left, fail the newest running request."""
        idle = sorted((s for s in self.table.idle if s.cached), key=lambda s: s.last_used)
        if idle:
            self.engine.memory.seq_rm(idle[0].id)
            idle[0].cached = []
            return
        newest = max(self._active.values(), key=lambda t: t.req.id, default=None)
        if newest is not None:
            log.warning("KV cache full: failing request %d", newest.req.id)
            self._fail(newest, Failed("the KV cache is full; retry later", "unavailable_error", 503))


def _deliver(batch: list[tuple[Sink, RequestEvent]]) -> None:
    for sink, event in batch:
        try:
            sink(event)
        except Exception:  # one broken sink must not starve the others
            log.exception("event sink failed")
