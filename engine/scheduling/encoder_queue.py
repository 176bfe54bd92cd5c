"""The encoder's queue and thread (issue 54): jobs of many short inputs, run as rounds.

A job is one HTTP request's inputs (an embedding batch, a rerank's pairs). Its inputs
are taken in order of length, so each round's inputs are of like length and pad little.
A round takes inputs from every waiting job in turn, until ``round_tokens`` tokens, and
runs them in one call of ``run`` on the encoder thread; so a 10,000-input job is served
round after round while a one-input job that comes meanwhile waits at most a round.
Nothing is refused for its size: only ``max_queue`` jobs waiting at once (QueueFull).

Thread contract: ``submit`` and ``cancel`` are called from the event loop; ``run`` is
called on the encoder thread only; a job's future is settled on its loop."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.errors import EngineStopped, QueueFull, StepFailed
from engine.scheduling.health import Health, StepClock

# Rounds between two hand-backs of free heap memory (and whenever the queue is empty).
# BERT-base Q8_0, 1,000 inputs of 32-256 tokens in one request (2-core Sapphire Rapids
# class): never during the batch, peak RSS 1,452 MB, 16.7 inputs/s; every round, 609 MB,
# 15.4-15.6; every 4, 617 MB, 15.9; every 16, 717 MB, 16.1 (the rates within run noise).
TRIM_EVERY = 4
# run(ids of each input, pooling of each, token types of each or None) -> one tensor each
RunFn = Callable[[list[list[int]], list[str], list[list[int]] | None], list[torch.Tensor]]


@dataclass(eq=False)
class _Job:
    inputs: list[list[int]]
    pooling: str
    type_ids: list[list[int]] | None
    future: asyncio.Future
    order: list[int] = field(default_factory=list)  # input indices, shortest first
    results: list = field(default_factory=list)
    n_taken: int = 0  # inputs handed to rounds
    n_done: int = 0
    cancelled: bool = False


class EncoderQueue:
    def __init__(self, run: RunFn, round_tokens: int, max_queue: int = 256, stall_timeout: float = 60.0):
        self._run, self.round_tokens, self.max_queue, self.stall_timeout = run, round_tokens, max_queue, stall_timeout
        self._jobs: list[_Job] = []  # jobs with inputs not yet taken, oldest first
        self._cond = threading.Condition()
        self._stopping = False
        self._round_since: float | None = None  # monotonic start of the running round
        self._n_round_jobs = 0
        self.n_faults = self.n_faults_in_row = 0
        self.clock = StepClock()
        self.n_inputs = self.n_tokens = 0  # inputs and tokens encoded since start
        self._thread = threading.Thread(target=self._loop, name="slotserve-encoder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, inputs: list[list[int]], pooling: str, type_ids: list[list[int]] | None = None) -> asyncio.Future:
        """Queue a job (from the event loop); its future gets one tensor per input, or the
        exception its round raised. Raises QueueFull, EngineStopped."""
        future = asyncio.get_running_loop().create_future()
        job = _Job(inputs, pooling, type_ids, future, sorted(range(len(inputs)), key=lambda i: len(inputs[i])))
        job.results = [None] * len(inputs)
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise EngineStopped("the encoder thread is not running")
            if len(self._jobs) >= self.max_queue:
                raise QueueFull(f"{len(self._jobs)} requests are waiting (--max-queue {self.max_queue})")
            if not inputs:
                future.set_result([])
                return future
            self._jobs.append(job)
            self._cond.notify()
        future.add_done_callback(lambda f: self._cancel(job) if f.cancelled() else None)
        return future

    def _cancel(self, job: _Job) -> None:
        """The caller went away: its inputs not yet taken are dropped."""
        with self._cond:
            job.cancelled = True
            if job in self._jobs:
                self._jobs.remove(job)

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Fail every waiting job (EngineStopped) and end the thread after its round.
        True when it has ended."""
        with self._cond:
            self._stopping = True
            jobs, self._jobs = self._jobs, []
            self._cond.notify_all()
        for job in jobs:
            self._settle(job, EngineStopped("the server is shutting down"))
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def health(self) -> Health:
        since = self._round_since
        stalled = since is not None and time.monotonic() - since > self.stall_timeout
        with self._cond:
            n_waiting = len(self._jobs)
        n_faults, in_row = self.n_faults, self.n_faults_in_row
        return Health(self._thread.is_alive(), stalled, n_waiting, self._n_round_jobs, n_faults, in_row, self.clock)

    def _take(self) -> list[tuple[_Job, int]]:
        """A round: inputs from each waiting job in turn, shortest first within a job,
        until ``round_tokens`` tokens (at least one input). Called holding the lock."""
        picked: list[tuple[_Job, int]] = []
        n_tokens = 0
        while self._jobs and (not picked or n_tokens < self.round_tokens):
            for job in list(self._jobs):
                i = job.order[job.n_taken]
                if picked and n_tokens + len(job.inputs[i]) > self.round_tokens:
                    return picked
                picked.append((job, i))
                n_tokens += len(job.inputs[i])
                job.n_taken += 1
                if job.n_taken == len(job.inputs):
                    self._jobs.remove(job)
        return picked

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                picked = self._take()
                self._round_since, self._n_round_jobs = time.monotonic(), len({id(job) for job, _ in picked})
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                inputs = [job.inputs[i] for job, i in picked]
                types = [job.type_ids[i] if job.type_ids else [0] * len(job.inputs[i]) for job, i in picked]
                typed = any(job.type_ids for job, _ in picked)
                out = self._run(inputs, [job.pooling for job, _ in picked], types if typed else None)
            except Exception as exc:  # a fault fails this round's jobs, not the thread
                self.n_faults, self.n_faults_in_row = self.n_faults + 1, self.n_faults_in_row + 1
                self._fail({job for job, _ in picked}, StepFailed([], exc))
            else:
                self.n_faults_in_row = 0
                self.n_inputs += len(picked)
                self.n_tokens += sum(map(len, inputs))
                for (job, i), vec in zip(picked, out):
                    job.results[i] = vec
                    job.n_done += 1
                    if job.n_done == len(job.inputs):
                        self._settle(job, job.results)
            finally:
                self.clock.add(time.perf_counter() - wall, time.thread_time() - cpu, len(picked), False)
                self._round_since, self._n_round_jobs = None, 0
                if self.clock.n % TRIM_EVERY == 0 or not self._jobs:
                    release_free_memory()

    def _fail(self, jobs: set[_Job], exc: BaseException) -> None:
        with self._cond:
            for job in jobs:
                if job in self._jobs:
                    self._jobs.remove(job)
        for job in jobs:
            self._settle(job, exc)

    @staticmethod
    def _settle(job: _Job, value) -> None:
        """Hand the job's outcome to its loop (a cancelled job's is dropped)."""
        if job.cancelled:
            return

        def settle() -> None:
            if job.future.done():
                return
            if isinstance(value, BaseException):
                job.future.set_exception(value)
            else:
                job.future.set_result(value)

        try:
            job.future.get_loop().call_soon_threadsafe(settle)
        except RuntimeError:  # the loop has closed
            pass


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (AttributeError, OSError):
        return None


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``). A round's
    activations differ in size from the last one's, and glibc keeps what they freed in
    its heap (its mmap threshold rises to the largest block freed), so without this the
    resident size grows round after round with many inputs (``TRIM_EVERY``). A no-op off
    glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
