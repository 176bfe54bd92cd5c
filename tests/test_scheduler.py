"""The scheduler on its engine thread, driven directly (no HTTP): pool exhaustion,
n > 1 sharing one prefill, cancelling a queued request."""

from __future__ import annotations

import threading

import pytest
from checkpoints import make_checkpoint
from waiting import wait_for

from engine import Engine, SamplingParams
from engine.scheduling.request import Admitted, Delta, Failed, Request
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.task_board import WAIT_FOR_SHARED


class Collector:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, Failed) or (isinstance(event, Delta) and event.finished):
            self.done.set()

    def wait(self, timeout=30):
        assert self.done.wait(timeout)
        return self


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("m") / "ckpt", "llama")


def make(folder, **kw) -> Scheduler:
    engine = Engine.from_pretrained(str(folder), block_size=8, **kw)
    scheduler = Scheduler(engine)
    scheduler.start()
    return scheduler


def test_pool_exhaustion_evicts_idle_caches_then_fails_the_newest(folder):
    sched = make(folder, n_ctx=64, n_seq_max=3)  # 8 + 3 blocks of 8 cells shared by 3 slots
    try:
        warm = Collector()
        sched.submit(Request(list(range(1, 41)), SamplingParams(temperature=0, max_tokens=2)), warm)
        warm.wait()  # leaves an idle slot holding ~41 cells
        params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)  # 60 cells each: both never fit
        first, second = Collector(), Collector()
        sched.submit(Request(list(range(100, 110)), params), first)
        sched.submit(Request(list(range(200, 210)), params), second)
        first.wait(), second.wait()
        outcomes = [c.events[-1] for c in (first, second)]
        assert isinstance(outcomes[0], Delta) and outcomes[0].n_generated == 50  # the older one finished
        failed = outcomes[1]
        assert isinstance(failed, Failed) and failed.status == 503 and "full" in failed.message
        report = sched.engine.memory_report()
        assert report["integrity"] == "ok"
        assert not any(s.busy for s in sched.table.slots)
    finally:
        sched.stop()


def test_n_choices_share_one_prefill(folder):
    sched = make(folder, n_ctx=512, n_seq_max=4)
    try:
        got = Collector()
        done = threading.Event()
        finished = []

        def sink(event):
            got.events.append(event)
            if isinstance(event, Delta) and event.finished:
                finished.append(event.index)
                if len(finished) == 3:
                    done.set()

        prompt = list(range(1, 70))
        sched.submit(Request(prompt, SamplingParams(temperature=1.0, seed=5, max_tokens=6), n=3), sink)
        assert done.wait(30)
        admitted = got.events[0]
        assert isinstance(admitted, Admitted) and len(admitted.id_slots) == 3
        tokens = {i: [e.token_id for e in got.events if isinstance(e, Delta) and e.index == i] for i in range(3)}
        assert all(len(t) == 6 for t in tokens.values())
        assert len({tuple(t) for t in tokens.values()}) > 1  # seeds differ per choice
        report = sched.engine.memory_report()
        prompt_blocks = -(-len(prompt) // 8)
        assert report["groups"][0]["n_blocks_used"] < 3 * prompt_blocks  # the prompt's full blocks are shared
        assert report["integrity"] == "ok"
    finally:
        sched.stop()


def test_cancel_a_queued_request(folder):
    sched = make(folder, n_ctx=512, n_seq_max=1)
    try:
        busy, queued = Collector(), Collector()
        sched.submit(Request([1, 2, 3], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)), busy)
        wait_for(lambda: busy.events, what="admitted")  # the only slot is taken
        id_queued = sched.submit(Request([4, 5, 6], SamplingParams(temperature=0, max_tokens=5)), queued)
        assert sched.health().n_waiting == 1
        sched.cancel(id_queued)
        busy.wait()
        later = Collector()  # queued after the cancelled one: once it is done, the other would have run
        sched.submit(Request([7, 8], SamplingParams(temperature=0, max_tokens=2)), later)
        later.wait()
        assert queued.events == [] and sched.health().n_waiting == 0
    finally:
        sched.stop()


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "stream"])
def test_users_arriving_together_compute_a_shared_start_once(folder, unified):
    """Three prompts with one 200-token start submitted at once, three idle slots and a
    60-token step: the first computes the start, the others wait until at most
    WAIT_FOR_SHARED of it is left to compute and copy the rest (Admitted.n_cached), and
    every answer equals the one computed alone."""
    shared = [(7 * i) % 250 + 1 for i in range(200)]
    prompts = [shared + [11 + u, 12, 13 + u] for u in range(3)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    sched = make(folder, n_ctx=1024, n_seq_max=3, max_batch_tokens=60, kv_unified=unified)
    try:
        sinks = [Collector() for _ in prompts]
        for prompt, sink in zip(prompts, sinks):
            sched.submit(Request(prompt, params), sink)
        for sink in sinks:
            sink.wait()
        admitted = [next(e for e in s.events if isinstance(e, Admitted)) for s in sinks]
        cached = sorted(a.n_cached for a in admitted)
        assert cached[0] == 0 and min(cached[1:]) > 200 - WAIT_FOR_SHARED  # two of three copied the start
        answers = [[e.token_id for e in s.events if isinstance(e, Delta)] for s in sinks]
        for prompt, answer in zip(prompts, answers):
            alone = Collector()
            sched.submit(Request(prompt, params, cache_prompt=False), alone)
            assert [e.token_id for e in alone.wait().events if isinstance(e, Delta)] == answer
        assert sched.engine.memory_report()["integrity"] == "ok"
    finally:
        sched.stop()
