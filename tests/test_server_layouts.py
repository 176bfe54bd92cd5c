"""The per-stream KV layout through a real server: what it reports, each slot's own
context, and slot files that move between the layouts and continue exactly."""

from __future__ import annotations

from pathlib import Path

import httpx
from server_proc import ServerProcess

from engine import Engine

N_SLOTS = 4


def complete(srv, prompt, n: int, id_slot: int, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "id_slot": id_slot, **kw}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def slot_action(srv, slot: int, action: str, filename: str) -> dict:
    r = httpx.post(f"{srv.url}/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_each_stream_is_a_slot_of_its_own_context(tmp_path):
    with ServerProcess("-np", str(N_SLOTS), "-c", "1000", "--no-kv-unified", log=tmp_path / "s.log") as srv:
        srv.wait_ready()
        memory = httpx.get(srv.url + "/props").json()["memory"]
        assert memory["layout"] == "stream" and memory["kind"] == "kv_stream" and memory["integrity"] == "ok"
        per_slot = 256  # 1000 / 4 = 250, rounded up to whole blocks of 16
        assert [s["n_ctx"] for s in httpx.get(srv.url + "/slots").json()] == [per_slot] * N_SLOTS
        assert httpx.get(srv.url + "/props").json()["default_generation_settings"]["n_ctx"] == per_slot
        too_long = httpx.post(srv.url + "/completion", json={"prompt": [5] * 300, "n_predict": 1}, timeout=60)
        assert too_long.status_code == 400 and too_long.json()["error"]["type"] == "exceed_context_size_error"
        two = httpx.post(
            srv.url + "/v1/completions",
            json={"prompt": "def f(x):", "max_tokens": 12, "n": 2, "temperature": 0},
            timeout=60,
        ).json()
        assert two["choices"][0]["text"] == two["choices"][1]["text"]  # n > 1 copies the prompt across streams
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'slotserve_cache_config_info{block_size="16"' in metrics and 'layout="stream"' in metrics


def test_a_slot_file_moves_between_layouts_and_continues_exactly(tmp_path):
    tokenizer = Engine.from_pretrained().tokenizer
    prompt = tokenizer.encode("def fibonacci(n):\n    ")
    common = ("-np", str(N_SLOTS), "--slot-save-path", str(tmp_path / "slots"))
    unified = ServerProcess(*common, "--kv-unified", log=tmp_path / "u.log")
    stream = ServerProcess(*common, "--no-kv-unified", log=tmp_path / "s.log")
    with unified, stream:
        unified.wait_ready()
        stream.wait_ready()
        whole = complete(unified, prompt, 48, id_slot=0, cache_prompt=False)["tokens"]  # the uninterrupted run
        first = complete(unified, prompt, 16, id_slot=1)["tokens"]
        n_saved = slot_action(unified, 1, "save", "moving.slot")["n_saved"]
        assert slot_action(stream, 3, "restore", "moving.slot")["n_restored"] == n_saved
        second = complete(stream, prompt + first, 16, id_slot=3)
        assert n_saved - 1 <= second["tokens_cached"] <= n_saved  # the restored cells were used
        n_saved = slot_action(stream, 3, "save", "moving.slot")["n_saved"]
        assert slot_action(unified, 2, "restore", "moving.slot")["n_restored"] == n_saved
        third = complete(unified, prompt + first + second["tokens"], 16, id_slot=2)
        assert n_saved - 1 <= third["tokens_cached"] <= n_saved
    assert first + second["tokens"] + third["tokens"] == whole
    assert Path(tmp_path / "slots" / "moving.slot").is_file()
