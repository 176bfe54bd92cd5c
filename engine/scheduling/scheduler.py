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

from engine.core.engine import Engine
from engine.core.rope_switch import switch_of
from engine.errors import EngineStopped, QueueFull, RequestError, SlotBusy, StepFailed, check_token_ids
from engine.prompt_cache.ram_tier import PromptCache
from engine.sampling.params import SamplingParams
from engine.scheduling.health import Health, StepClock
from engine.scheduling.request import Failed, Request, RequestEnd, RequestEvent
from engine.scheduling.slots import SlotTable
from engine.scheduling.task_board import STEP_FAULT, Sink, Task, TaskBoard
from memory import CacheFull

log = logging.getLogger("slotserve.scheduler")


@dataclass(frozen=True)
class SlotInfo:
    id: int
    n_ctx: int
    is_processing: bool
    id_task: int | None
    n_prompt_tokens: int
    n_cached: int
    n_decoded: int
    params: SamplingParams | None  # the running request's (None when idle)
    cache: list[dict]  # per layer group: kind, blocks it holds, of those shared with other slots
    checkpoints: list[int]  # positions the slot's cache can be put back to (recurrent / sliding-window kinds)
    prompt_cache: dict | None = None  # its latest prompt's restore: {"tier": "ram" | "disk", "n_tokens": n}


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], object]
    future: concurrent.futures.Future
    idle_slot: int | None
    wait: bool


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        similarity: float = 0.1,
        max_queue: int = 256,
        stall_timeout: float = 60.0,
        loop: asyncio.AbstractEventLoop | None = None,
        on_end: Callable[[RequestEnd], None] | None = None,
        prompt_cache: PromptCache | None = None,
        cache_idle_slots: bool = True,
    ):
        """``on_end``: told of every request's end, on the engine thread, before its last
        slot is released (see TaskBoard). ``prompt_cache``: host-RAM states of slots taken
        for other prompts (see TaskBoard)."""
        self.engine = engine
        self.loop = loop
        self._outbox: list[tuple[Sink, RequestEvent]] = []  # engine thread only
        self.table = SlotTable(engine.config.n_seq_max, similarity)
        self.max_queue = max_queue
        self.stall_timeout = stall_timeout
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._inbox: deque[Task] = deque()  # new tasks (guarded by _cv)
        self._cancels: set[int] = set()  # guarded by _cv
        self._calls: deque[_Call] = deque()  # guarded by _cv
        self._deferred: list[_Call] = []  # calls waiting for their slot to be idle (engine thread only)
        self._n_waiting = 0  # queued, not yet in a slot (guarded by _cv)
        self.prompt_cache = prompt_cache
        if prompt_cache is not None and prompt_cache.disk is not None:
            prompt_cache.disk.on_ready = self._wake  # a state read off this thread: a waiting request may start
        self.board = TaskBoard(engine, self.table, self._emit, on_end, prompt_cache, cache_idle_slots)  # engine thread
        self._stop = False
        self._dying = False  # the thread is ending on an error (set before its requests are failed)
        self._busy_since: float | None = None
        self.n_faults = 0
        self.n_faults_in_row = 0
        self.clock = StepClock()  # written by the engine thread only
        self._thread = threading.Thread(target=self._run, name="slotserve-engine", daemon=True)

    # ---- any thread ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Stop the engine thread at its next step boundary: every running and waiting
        request fails with 503 "shutting down" (streams get their final error event),
        later ``submit``/``call`` raise EngineStopped. Waits up to ``timeout`` s for the
        thread to end (0: do not wait); returns whether it has ended. Idempotent."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if timeout != 0 and self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def validate(self, req: Request) -> None:
        """Raise RequestError for what can never run (independent of load)."""
        n_slots, n_ctx = len(self.table), self.engine.n_ctx_seq
        if req.id_slot == -1:  # llama-server's "any slot"
            req.id_slot = None
        if req.id_slot is not None and not 0 <= req.id_slot < n_slots:
            raise RequestError(f"id_slot {req.id_slot} out of range [0, {n_slots})", code="invalid_id_slot")
        if not 1 <= req.n <= n_slots:
            raise RequestError(f"n must be in [1, {n_slots}] (the number of slots)", code="invalid_n")
        if not req.prompt_ids:
            raise RequestError("the prompt is empty")
        check_token_ids(req.prompt_ids, self.engine.model_config.vocab_size)
        n_prompt = len(req.prompt_ids)
        if req.pooling is not None and req.n != 1:
            raise RequestError("an embedding has one choice (n = 1)", code="invalid_n")
        if req.pooling == "rank" and self.engine.rank_head is None:
            raise RequestError("this model does not rank: it needs a reranker started with --rerank")
        if n_prompt >= n_ctx:  # max_tokens past the context is not refused: generation ends there ("length")
            what = "an input to embed" if req.pooling is not None else "the prompt"
            raise RequestError(
                f"{what} of {n_prompt} tokens is too large: the slot's context is {n_ctx}",
                "exceed_context_size_error",
                n_prompt_tokens=n_prompt,
                n_ctx=n_ctx,
            )

    def submit(self, req: Request, sink: Sink) -> int:
        """Queue ``req``; returns its id. Raises RequestError or QueueFull."""
        self.validate(req)
        switch = switch_of(self.engine.model)
        req.rope_long = switch is not None and len(req.prompt_ids) > switch
        with self._cv:
            if self._stop or not self._thread.is_alive():
                raise EngineStopped("the engine thread is not running")
            if self._n_waiting >= self.max_queue + len(self.table.idle):  # idle slots admit at once
                raise QueueFull(f"{self._n_waiting} requests are waiting (--max-queue {self.max_queue})")
            req.id = next(self._ids)
            self._n_waiting += 1
            self._inbox.append(Task(req, sink))
            self._cv.notify()
        return req.id

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def cancel(self, id_task: int) -> None:
        with self._cv:
            self._cancels.add(id_task)
            self._cv.notify()

    async def call(self, fn: Callable[[], object], idle_slot: int | None = None, wait: bool = True) -> object:
        """Run ``fn()`` on the engine thread between two steps (where memory may be
        read or changed safely) and return its result or raise its exception.

        ``idle_slot``: run only while that slot is idle — after its request ends when it
        is busy (before any waiting request may take it), or raise SlotBusy at once
        when ``wait`` is False. Cancelling the awaiting coroutine drops a waiting call.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stop or not self._thread.is_alive():
                raise EngineStopped("the engine thread is not running")
            self._calls.append(_Call(fn, future, idle_slot, wait))
            self._cv.notify()
        return await asyncio.wrap_future(future)

    def health(self) -> Health:
        busy = self._busy_since
        stalled = busy is not None and time.monotonic() - busy > self.stall_timeout
        alive = self._thread.is_alive() and not self._dying
        clock = dataclasses.replace(self.clock)
        n_running = len(self.board.active)
        return Health(alive, stalled, self._n_waiting, n_running, self.n_faults, self.n_faults_in_row, clock)

    def lora_use(self) -> tuple[set[int], set[int]]:
        """The adapters (by id) that running requests use, and those waiting requests
        will (a racy read, for metrics: the copies are taken whole under the GIL)."""

        def used(tasks) -> set[int]:
            return {i for t in tasks for i, scale in enumerate(t.req.lora) if scale}

        return used(list(self.board.active.values())), used([*list(self.board.waiting), *list(self._inbox)])

    def snapshot(self) -> list[SlotInfo]:
        """Per-slot state for /slots (a racy read, good enough for monitoring)."""
        out = []
        memory = self.engine.memory
        for slot in self.table.slots:
            groups = memory.usage(held_by=[slot.id]).groups
            cache = [{"kind": g.kind, "n_blocks": g.n_blocks_held, "n_shared": g.n_blocks_shared} for g in groups]
            task, seq = self.board.seq_of(slot)
            out.append(
                SlotInfo(
                    id=slot.id,
                    n_ctx=self.engine.n_ctx_seq,
                    is_processing=slot.busy,
                    id_task=slot.id_task,
                    n_prompt_tokens=len(task.req.prompt_ids) if task else 0,
                    n_cached=seq.n_computed if seq else len(slot.cached),
                    n_decoded=len(seq.output_ids) if seq else 0,
                    params=task.req.params if task else None,
                    cache=cache,
                    checkpoints=memory.checkpoints(slot.id),
                    prompt_cache=dict(zip(("tier", "n_tokens"), slot.restored)) if slot.restored else None,
                )
            )
        return out

    # ---- engine thread ---------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException:
            self._dying = True  # /health says so before any request hears of it
            raise
        finally:  # asked to stop, or dying: nobody may wait for this thread any more
            self._shut_down()

    def _shut_down(self) -> None:
        with self._cv:
            self._stop = True
            self.board.waiting.extend(self._inbox)
            self._inbox.clear()
            calls, self._calls = [*self._calls, *self._deferred], deque()
        shutting_down = Failed("the server is shutting down", "unavailable_error", 503)
        self.board.fail_all(shutting_down)
        if self.prompt_cache is not None:  # with a disk tier: what the cache and idle slots hold, kept
            idle = [s for s in self.table.slots if not s.busy] if self.board.cache_idle_slots else []
            try:
                self.prompt_cache.close(self.engine.memory, idle)
            except Exception:  # noqa: BLE001 (losing cache entries must not stop the shutdown)
                log.exception("writing the prompt cache out at shutdown failed")
        n_failed = self.board.fail_waiting(shutting_down)
        with self._cv:
            self._n_waiting -= n_failed
        self._flush()
        for call in calls:
            if call.future.set_running_or_notify_cancel():
                call.future.set_exception(EngineStopped("the engine thread stopped"))

    def _turn(self) -> bool:
        """One loop turn: take news, run calls, admit, step once, hand events over.
        False when asked to stop. A bug in the bookkeeping fails the running requests
        and the thread goes on (it never dies silently)."""
        with self._cv:
            while not self._has_news():
                self._busy_since = None
                self._cv.wait()
            if self._stop:
                return False
            self.board.waiting.extend(self._inbox)
            self._inbox.clear()
            cancels, self._cancels = self._cancels, set()
            calls, self._calls = self._calls, deque()
        self._busy_since = self._busy_since or time.monotonic()
        try:
            n_left = sum(self.board.cancel(id_task) for id_task in cancels)
            self._run_calls(calls)
            n_left += self.board.admit()
            if n_left:
                with self._cv:
                    self._n_waiting -= n_left
            if self.engine.has_work:
                self._step()
                self._busy_since = time.monotonic()
        except Exception:
            log.exception("scheduler turn failed")
            self._count_fault()
            self.board.fail_all(Failed("internal error in the scheduler", "server_error", 500))
            with self._cv:  # recount: the turn may have stopped between admission and the count
                self._n_waiting = len(self.board.waiting) + len(self._inbox)
        self._flush()
        return True

    def _emit(self, task: Task, event: RequestEvent) -> None:
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

    def _run_calls(self, calls: deque[_Call]) -> None:
        """Deferred calls whose slot is now idle first (in arrival order), then new ones."""
        pending, self._deferred = [*self._deferred, *calls], []
        for call in pending:
            if call.future.cancelled():
                continue
            if call.idle_slot is not None and self.table.slots[call.idle_slot].busy:
                if call.wait:
                    self._deferred.append(call)
                    continue
                if call.future.set_running_or_notify_cancel():
                    call.future.set_exception(SlotBusy(f"slot {call.idle_slot} is busy"))
                continue
            if not call.future.set_running_or_notify_cancel():
                continue
            try:
                call.future.set_result(call.fn())
            except Exception as exc:  # handed to the caller
                call.future.set_exception(exc)

    def _has_news(self) -> bool:
        queued = self._stop or self._inbox or self._cancels or self._calls
        ready = any(not self.table.slots[c.idle_slot].busy or c.future.cancelled() for c in self._deferred)
        return bool(queued) or ready or self.engine.has_work or self.board.admittable()

    def _step(self) -> None:
        wall, cpu, n_busy = time.perf_counter(), time.thread_time(), len(self.engine.running)
        try:
            events = self.engine.step()
        except CacheFull:
            self.board.make_room()
            return
        except StepFailed as exc:  # a bug or a device fault, not client input: fail that step's requests
            log.error("engine step failed (%d sequences): %s", len(exc.seqs), exc, exc_info=exc.cause)
            self._count_fault()
            self.board.fail_seqs(exc.seqs, STEP_FAULT)
            return
        self.clock.add(time.perf_counter() - wall, time.thread_time() - cpu, n_busy, self.engine.last_step_decode_only)
        n_failed = self.board.dispatch(events)  # a fault of one sequence fails its request alone
        if n_failed:
            self._count_fault(n_failed, in_row=n_failed == len(events))
        else:
            self.n_faults_in_row = 0

    def _count_fault(self, n: int = 1, in_row: bool = True) -> None:
        """``in_row``: nothing in that step went right (else the run of faults ends)."""
        self.n_faults += n
        self.n_faults_in_row = self.n_faults_in_row + 1 if in_row else 0


def _deliver(batch: list[tuple[Sink, RequestEvent]]) -> None:
    for sink, event in batch:
        try:
            sink(event)
        except Exception:  # one broken sink must not starve the others
            log.exception("event sink failed")
