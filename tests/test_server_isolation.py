"""One request's fault is that request's alone. A fault is injected (from the test side,
into a real in-process server) for one sequence while it shares its steps with another:
in sampling, in accepting its token, in planning the step, in its context shift, and in
turning its event into request events. That request ends with a 500; the other one
runs on token for token as it runs alone; the server keeps serving."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from server_proc import InProcessServer, metric
from waiting import wait_for

import engine.core.acceptance as acceptance_module
import engine.core.engine as engine_module
from engine.core.engine import Engine
from engine.scheduling.task_board import TaskBoard

POISON = [3, 1, 4, 1, 5, 9, 2, 6]  # the prompt (token ids) of the request the fault picks out
# 200 tokens: longer than the 64 between two of the poisoned request's context shifts
HEALTHY = {"prompt": "def add(a, b):", "n_predict": 200, "temperature": 0, "ignore_eos": True}


def _poisoned(seq) -> bool:
    return seq.prompt_ids[: len(POISON)] == POISON


class Trap:
    """Armed once the poisoned sequence runs beside another; from then on it fires for
    the poisoned one (so the fault happens in a step that other sequences share)."""

    def __init__(self) -> None:
        self.armed = False
        self.n_fired = 0

    def fires(self, running, seqs) -> bool:
        if any(_poisoned(s) for s in running) and any(not _poisoned(s) for s in running):
            self.armed = True
        fire = self.armed and any(_poisoned(s) for s in seqs)
        self.n_fired += fire
        return fire


def _install(site: str, trap: Trap, monkeypatch) -> None:
    if site == "sampling":
        real = acceptance_module.sample

        def sample(logits, rows):
            seqs = [_Row(r) for r in rows]
            if trap.fires(seqs, seqs):
                raise ValueError("injected fault in sampling")
            return real(logits, rows)

        monkeypatch.setattr(acceptance_module, "sample", sample)
    elif site == "planning":
        real_plan = engine_module.plan_step

        def plan_step(running, budget, align=None):
            if trap.fires(running, running):
                raise RuntimeError("injected fault in planning")
            return real_plan(running, budget, align)

        monkeypatch.setattr(engine_module, "plan_step", plan_step)
    elif site == "accepting":
        real_accept = Engine._accept

        def accept(self, seq, out, row):
            if trap.fires(self.running, [seq]):
                raise RuntimeError("injected fault in accepting a token")
            return real_accept(self, seq, out, row)

        monkeypatch.setattr(Engine, "_accept", accept)
    elif site == "shifting":
        real_shift = Engine._shift

        def shift(self, seq):
            if trap.fires(self.running, [seq]):
                raise RuntimeError("injected fault in a context shift")
            return real_shift(self, seq)

        monkeypatch.setattr(Engine, "_shift", shift)
    elif site == "dispatching":
        real_dispatch = TaskBoard._dispatch

        def dispatch(self, event):
            if event.token_id is not None and trap.fires(self.engine.running, [event.seq]):
                raise KeyError("injected fault in dispatching")
            return real_dispatch(self, event)

        monkeypatch.setattr(TaskBoard, "_dispatch", dispatch)


class _Row:
    """A sampling row seen as a sequence (the trap reads ``prompt_ids``)."""

    def __init__(self, row) -> None:
        self.prompt_ids = row.prompt_ids


@pytest.fixture(scope="module")
def srv():
    # 2 slots of 128 tokens: the poisoned request runs on through context shifts
    with InProcessServer(metrics=True, parallel=2, ctx_size=256, context_shift=True) as server:
        yield server


def _healthy(srv) -> list[int]:
    r = httpx.post(srv.url + "/completion", json=HEALTHY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.fixture(scope="module")
def alone(srv) -> list[int]:
    """The healthy request's tokens with nothing beside it (greedy: the same every time)."""
    return _healthy(srv)


def _poison_stream(srv, out: dict) -> None:
    body = {"prompt": POISON, "n_predict": 100_000, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/completion", json=body, timeout=120) as r:
        out["status"] = r.status_code
        out["last"] = [line for line in r.iter_lines() if line.startswith("data: ")][-1]


@pytest.mark.parametrize("site", ["sampling", "accepting", "planning", "shifting", "dispatching"])
def test_a_fault_for_one_sequence_fails_its_request_alone(srv, alone, monkeypatch, site):
    n_errors = metric(srv.url, "slotserve_requests_total", finish_reason="error")
    n_faults = metric(srv.url, "slotserve_engine_faults_total")
    trap = Trap()
    _install(site, trap, monkeypatch)
    poison: dict = {}
    thread = threading.Thread(target=_poison_stream, args=(srv, poison))
    thread.start()
    wait_for(lambda: any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json()), what="poison running")
    beside = _healthy(srv)
    thread.join(120)
    assert trap.armed and trap.n_fired >= 1  # the fault hit a step the healthy request shared
    assert poison["status"] == 200
    error = json.loads(poison["last"][len("data: ") :])["error"]
    assert error["code"] == 500 and "engine step" in error["message"]
    assert beside == alone  # token for token as if the poisoned request had not been there
    monkeypatch.undo()
    assert httpx.get(srv.url + "/ready").status_code == 200
    assert _healthy(srv) == alone  # and the server goes on serving, right
    wait_for(lambda: metric(srv.url, "slotserve_requests_total", finish_reason="error") == n_errors + 1)
    assert metric(srv.url, "slotserve_engine_faults_total") >= n_faults + 1
    slots = httpx.get(srv.url + "/slots").json()
    assert not any(s["is_processing"] for s in slots)
    assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
