"""Faults injected from the test side into a real in-process server: an exception in
the forward, a stalled step, a dead engine thread, a full disk during a slot save, a
slot caught between states. Each fails what it must, with an OpenAI-shaped error, and
the server goes on (or says truthfully that it cannot)."""

from __future__ import annotations

import errno
import json
import os
import threading

import httpx
import pytest
from server_proc import InProcessServer, metric
from waiting import wait_for

from engine.core.runner import ModelRunner
from engine.scheduling import slot_io

FAULT = [3, 1, 4, 1, 5, 9, 2, 6]  # a prompt (token ids) whose steps the patched forward fails
STALL = [2, 7, 1, 8, 2, 8]  # ... whose step the patched forward holds until released


@pytest.fixture
def faulty_forward(monkeypatch):
    release = threading.Event()
    real_run = ModelRunner.run

    def run(self, plan):
        prompts = [c.seq.prompt_ids for c in plan]
        if any(p[: len(FAULT)] == FAULT for p in prompts):
            raise RuntimeError("injected fault in the forward")
        if any(p[: len(STALL)] == STALL for p in prompts):
            release.wait(60)
        return real_run(self, plan)

    monkeypatch.setattr(ModelRunner, "run", run)
    return release


def complete(url: str, prompt, **kw) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, **kw}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_a_failing_forward_fails_its_requests_and_five_in_a_row_turn_ready_off(faulty_forward):
    with InProcessServer(metrics=True, parallel=2, ctx_size=512) as srv:
        r = complete(srv.url, FAULT)
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error" and "engine step" in r.json()["error"]["message"]
        with httpx.stream("POST", srv.url + "/v1/completions", json={"prompt": FAULT, "stream": True}) as s:
            assert s.status_code == 200
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert json.loads(lines[-1][6:])["error"]["code"] == 500  # the stream ends with an error event
        slots = httpx.get(srv.url + "/slots").json()
        assert not any(s["is_processing"] for s in slots) and all(s["n_cached"] == 0 for s in slots)
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
        assert metric(srv.url, "slotserve_engine_faults_total") == 2
        assert metric(srv.url, "slotserve_requests_total", finish_reason="error") == 2
        assert httpx.get(srv.url + "/ready").status_code == 200
        assert complete(srv.url, "def f():").status_code == 200  # a good step resets the count
        for _ in range(5):
            assert complete(srv.url, FAULT).status_code == 500
        for probe in ("/ready", "/health"):
            r = httpx.get(srv.url + probe)
            assert r.status_code == 503 and "5 engine steps failed in a row" in r.json()["error"]
        assert complete(srv.url, "def f():").status_code == 200  # still serving; the replica recovers
        assert httpx.get(srv.url + "/ready").status_code == 200


def test_a_stalled_step_turns_health_off_until_it_ends(faulty_forward):
    with InProcessServer(metrics=True, parallel=2, ctx_size=512, stall_timeout=0.3) as srv:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", complete(srv.url, STALL)))
        t.start()
        stalled = wait_for(lambda: (r := httpx.get(srv.url + "/health")).status_code == 503 and r)
        assert "no step finished for 0.3 s" in stalled.json()["error"]
        faulty_forward.set()
        t.join(60)
        assert result["r"].status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread dies on purpose
def test_a_dead_engine_thread_is_503_everywhere(monkeypatch, tmp_path):
    """/health says the thread died from the moment its requests are failed, though
    the thread has not ended yet (here it is held there: /health once read 200 in that
    gap, once in a suite run)."""
    from engine.scheduling.scheduler import Scheduler

    def die(self, plan):
        raise SystemExit("injected: the engine thread dies")

    released, real_shut_down = threading.Event(), Scheduler._shut_down

    def shut_down_and_linger(self):
        real_shut_down(self)
        released.wait(60)

    monkeypatch.setattr(Scheduler, "_shut_down", shut_down_and_linger)
    with InProcessServer(metrics=True, parallel=2, ctx_size=512, slot_save_path=tmp_path) as srv:
        monkeypatch.setattr(ModelRunner, "run", die)
        r = complete(srv.url, "def f():")
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"  # not a hang
        health = httpx.get(srv.url + "/health")
        released.set()
        assert health.status_code == 503 and "died" in health.json()["error"]
        assert httpx.get(srv.url + "/ready").status_code == 503
        for method, path, body in (
            ("POST", "/v1/completions", {"prompt": "x"}),
            ("GET", "/props", None),
            ("POST", "/slots/0?action=erase", None),
        ):
            r = httpx.request(method, srv.url + path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["type"] == "unavailable_error" and r.headers["retry-after"] == "1"


def test_a_full_disk_during_a_save_is_507_and_keeps_the_old_file(monkeypatch, tmp_path):
    with InProcessServer(metrics=True, parallel=2, ctx_size=512, slot_save_path=tmp_path) as srv:
        assert complete(srv.url, "def f(x):\n    return x", id_slot=0, max_tokens=8).status_code == 200
        save = lambda name: httpx.post(srv.url + "/slots/0?action=save", json={"filename": name})  # noqa: E731
        assert save("kept.bin").status_code == 200
        old = (tmp_path / "kept.bin").read_bytes()
        real_write = os.write

        def write(fd, data):  # the disk fills up 4 KiB into any slot file
            if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == str(tmp_path.resolve()):
                if os.lseek(fd, 0, os.SEEK_CUR) >= 4096:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real_write(fd, bytes(data[:4096]))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
        for name in ("kept.bin", "new.bin"):
            r = save(name)
            assert r.status_code == 507, r.text
            assert r.json()["error"]["code"] == "write_failed" and "No space left" in r.json()["error"]["message"]
        monkeypatch.undo()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.bin"]  # no temporary file left, no new.bin
        assert (tmp_path / "kept.bin").read_bytes() == old
        assert metric(srv.url, "slotserve_slot_file_operations_total", action="save", outcome="error") == 2


def test_a_slot_between_states_is_409(monkeypatch, tmp_path):
    def not_ready(board, slot_id):
        raise slot_io.SlotNotReady(f"slot {slot_id} is being set up for a request; retry")

    with InProcessServer(metrics=True, parallel=2, ctx_size=512, slot_save_path=tmp_path) as srv:
        monkeypatch.setattr(slot_io, "snapshot", not_ready)
        r = httpx.post(srv.url + "/slots/1?action=save", json={"filename": "x.bin"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "slot_busy"
        assert list(tmp_path.iterdir()) == []
