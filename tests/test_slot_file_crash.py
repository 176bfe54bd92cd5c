"""SIGKILL in the middle of saving a slot leaves the previous file intact, and the
temporary file it leaves behind is never taken for a slot file. The test hook holds
the save half-written (tests/hooked_serve.py, ``write.hold``), so the kill lands
mid-write every time."""

from __future__ import annotations

import os
import signal
import threading

import httpx
from server_proc import ServerProcess
from waiting import wait_for

from memory.files.slot_dir import TMP_PREFIX
from memory.files.slot_file import decode


def post(srv, slot: int, action: str, filename: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=120)


def complete(srv, prompt: str, slot: int) -> None:
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "id_slot": slot}
    assert httpx.post(srv.url + "/completion", json=body, timeout=60).status_code == 200


def test_sigkill_during_save_keeps_the_old_file(tmp_path):
    slots, control = tmp_path / "slots", tmp_path / "control"
    control.mkdir()
    args = ("-np", "2", "--slot-save-path", str(slots))
    with ServerProcess(*args, log=tmp_path / "a.log", hooks=control) as srv:
        srv.wait_ready()
        complete(srv, "hello", 0)
        assert post(srv, 0, "save", "session.slot").status_code == 200
        old = (slots / "session.slot").read_bytes()
        complete(srv, "a different and longer conversation", 1)

        (control / "write.hold").touch()  # the next save stops half-way through its write
        threading.Thread(target=lambda: _ignore_errors(post, srv, 1, "save", "session.slot"), daemon=True).start()
        started = lambda: any(n.startswith(TMP_PREFIX) and os.path.getsize(slots / n) for n in os.listdir(slots))  # noqa: E731
        wait_for(started, 60, "the save writing")
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)

    assert (slots / "session.slot").read_bytes() == old  # the old file, whole
    strays = [n for n in os.listdir(slots) if n.startswith(TMP_PREFIX)]
    assert len(strays) == 1
    with ServerProcess(*args, log=tmp_path / "b.log") as srv:
        srv.wait_ready()
        listed = [e["filename"] for e in httpx.get(srv.url + "/slots/files").json()["data"]]
        assert listed == ["session.slot"]
        r = post(srv, 0, "restore", strays[0])
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_filename"
        restored = post(srv, 0, "restore", "session.slot").json()
        assert restored["n_restored"] == len(decode(old).tokens)


def _ignore_errors(fn, *args) -> None:
    try:
        fn(*args)
    except httpx.HTTPError:
        pass  # the server was killed under it
