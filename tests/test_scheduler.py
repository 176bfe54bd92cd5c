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
