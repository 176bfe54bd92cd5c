"""SIGKILL in the middle of saving a large slot leaves the previous file intact, and the
temporary file it leaves behind is never taken for a slot file."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
import torch
from checkpoints import make_checkpoint
from server_proc import ServerProcess

from memory import SeqState
from memory.slot_dir import TMP_PREFIX
from memory.slot_file import decode, encode

# 16 layers x 8 KV heads x 128 dims x K and V x 4 bytes = 128 KiB of cache per token
WIDE = dict(num_hidden_layers=16, num_attention_heads=8, num_key_value_heads=8, head_dim=128)
N_BIG = 1000  # tokens: a 128 MiB slot file


def post(srv, slot: int, action: str, filename: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=120)


@pytest.mark.slow
def test_sigkill_during_save_keeps_the_old_file(tmp_path):
    model = make_checkpoint(tmp_path / "wide", max_position_embeddings=4096, **WIDE)
    slots = tmp_path / "slots"
    args = ("-m", str(model), "-np", "2", "-c", "4096", "--slot-save-path", str(slots))
    with ServerProcess(*args, log=tmp_path / "a.log") as srv:
        srv.wait_ready()
        body = {"prompt": "hello", "n_predict": 4, "temperature": 0, "id_slot": 0}
        assert httpx.post(srv.url + "/completion", json=body, timeout=60).status_code == 200
        assert post(srv, 0, "save", "session.slot").status_code == 200
        old = (slots / "session.slot").read_bytes()

        small = decode(old)  # a large slot built from the small one's fingerprint and shapes
        g = torch.Generator().manual_seed(0)
        tensors = {k: torch.randn(N_BIG, *t.shape[1:], generator=g) for k, t in small.state.tensors.items()}
        big = encode([7] * N_BIG, SeqState(torch.arange(N_BIG), tensors, small.state.meta), small.fingerprint)
        (slots / "big-source.slot").write_bytes(big)
        assert post(srv, 1, "restore", "big-source.slot").json()["n_restored"] == N_BIG

        threading.Thread(target=lambda: _ignore_errors(post, srv, 1, "save", "session.slot"), daemon=True).start()
        deadline = time.monotonic() + 60
        while not any(n.startswith(TMP_PREFIX) and os.path.getsize(slots / n) for n in os.listdir(slots)):
            assert time.monotonic() < deadline, "the save never started writing"
            time.sleep(0.0005)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)

    assert (slots / "session.slot").read_bytes() == old  # the old file, whole
    strays = [n for n in os.listdir(slots) if n.startswith(TMP_PREFIX)]
    assert strays, "the kill came after the rename: the file was not large enough"
    with ServerProcess(*args, log=tmp_path / "b.log") as srv:
        srv.wait_ready()
        listed = [e["filename"] for e in httpx.get(srv.url + "/slots/files").json()["data"]]
        assert sorted(listed) == ["big-source.slot", "session.slot"]
        r = post(srv, 0, "restore", strays[0])
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_filename"
        restored = post(srv, 0, "restore", "session.slot").json()
        assert restored["n_restored"] == len(decode(old).tokens)


def _ignore_errors(fn, *args) -> None:
    try:
        fn(*args)
    except httpx.HTTPError:
        pass  # the server was killed under it
