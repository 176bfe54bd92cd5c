"""Progress of slot saves and restores: reported (log lines here, no terminal) for files
over the threshold, silent below it."""

from __future__ import annotations

import logging

import httpx
from server_proc import InProcessServer

from server.telemetry import progress


def test_big_slot_saves_and_restores_report_progress(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="slotserve")
    with InProcessServer(parallel=1, slot_save_path=tmp_path) as srv:
        body = {"prompt": "def main():", "n_predict": 4, "id_slot": 0}
        assert httpx.post(srv.url + "/completion", json=body, timeout=60).status_code == 200
        save = lambda name: httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": name}, timeout=60)  # noqa: E731
        assert save("small.slot").status_code == 200
        assert not [r for r in caplog.records if "saving slot" in r.getMessage()]  # under 100 MB: silent
        monkeypatch.setattr(progress, "SLOT_FILE_MIN_BYTES", 0)
        assert save("big.slot").status_code == 200
        restore = httpx.post(f"{srv.url}/slots/0?action=restore", json={"filename": "big.slot"}, timeout=60)
        assert restore.status_code == 200
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("saving slot 0 to big.slot:") and m.endswith("(100%)") for m in lines), lines
    assert any(m.startswith("restoring slot 0 from big.slot:") and m.endswith("(100%)") for m in lines)
