"""The per-stream KV layout through a real server: what it reports, each slot's own
context, and slot files that move between the layouts and continue exactly."""

from __future__ import annotations

from pathlib import Path

import httpx
from server_proc import InProcessServer, ServerProcess

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
    with InProcessServer.from_flags(
        "--metrics", "-np", str(N_SLOTS), "-c", "1000", "--no-kv-unified", log=tmp_path / "s.log"
    ) as srv:
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
    unified = InProcessServer.from_flags("--metrics", *common, "--kv-unified", log=tmp_path / "u.log")
    stream = InProcessServer.from_flags("--metrics", *common, "--no-kv-unified", log=tmp_path / "s.log")
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


def test_a_windowed_model_reuses_its_slot_across_turns(tmp_path):
    """Gemma 2 (window 8, rings of 8 - 1 + 32 cells): a follow-up that extends the
    conversation reuses the whole cache; one that re-renders the last turn reuses the
    prompt up to the last checkpoint; both answer what a cold run answers."""
    from checkpoints import make_checkpoint

    folder = make_checkpoint(
        tmp_path / "gemma2", "gemma2", num_hidden_layers=4, sliding_window=8, query_pre_attn_scalar=24
    )
    args = ("-m", str(folder), "-np", "2", "-c", "1024", "-ub", "32", "--slot-save-path", str(tmp_path / "s"))
    with InProcessServer.from_flags("--metrics", *args, log=tmp_path / "g.log") as srv:
        srv.wait_ready()
        memory = httpx.get(srv.url + "/props").json()["memory"]
        assert memory["kind"] == "kv_iswa"
        assert [g["kind"] for g in memory["groups"]] == ["attention_full", "attention_sliding"]
        metrics = httpx.get(srv.url + "/metrics").text
        for kind in ("attention_full", "attention_sliding"):  # one series per kind of layer group
            assert f'slotserve_kv_cache_blocks_capacity{{memory_kind="{kind}"}}' in metrics
        ids = lambda text: httpx.post(srv.url + "/tokenize", json={"content": text}).json()["tokens"]  # noqa: E731
        prompt = ids("User: say something long about windows\nAssistant:")
        first = complete(srv, prompt, 60, id_slot=0)
        follow = prompt + first["tokens"] + ids("\nUser: and more\nAssistant:")
        warm = complete(srv, follow, 8, id_slot=0)
        cold = complete(srv, follow, 8, id_slot=1, cache_prompt=False)
        assert warm["tokens_cached"] >= first["tokens_evaluated"] + 50 and cold["tokens_cached"] == 0
        assert warm["tokens"] == cold["tokens"]
        rerendered = prompt + ids(" (edited)\nUser: again\nAssistant:")  # shares the first prompt only
        again = complete(srv, rerendered, 8, id_slot=0)
        fresh = complete(srv, rerendered, 8, id_slot=1, cache_prompt=False)
        assert again["tokens_cached"] == len(prompt)  # back to the first prompt's checkpoint
        assert again["tokens"] == fresh["tokens"]
        # a slot file of a windowed cache holds the window and continues exactly
        held = rerendered + again["tokens"][:-1]
        assert slot_action(srv, 0, "save", "window.slot")["n_saved"] == len(held)
        assert slot_action(srv, 1, "restore", "window.slot")["n_restored"] == len(held)
        more = held + ids(" tail")
        restored = complete(srv, more, 8, id_slot=1)
        cold_more = complete(srv, more, 8, id_slot=0, cache_prompt=False)
        assert restored["tokens_cached"] == len(held) and restored["tokens"] == cold_more["tokens"]
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
    full_args = ("-m", str(folder), "-np", "2", "--swa-full", "--slot-save-path", str(tmp_path / "s"))
    with InProcessServer.from_flags(
        "--metrics", *full_args, log=tmp_path / "full.log"
    ) as full:  # the same model, full-size caches
        full.wait_ready()
        before = httpx.get(full.url + "/slots").json()[0]["n_cached"]
        r = httpx.post(f"{full.url}/slots/0", params={"action": "restore"}, json={"filename": "window.slot"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_slot_file"  # the window is not enough
        assert httpx.get(full.url + "/slots").json()[0]["n_cached"] == before
    shift = ServerProcess("--metrics", "-m", str(folder), "--context-shift", log=tmp_path / "shift.log")
    with shift:  # a setting the model cannot take: one line naming the way out, and exit 1
        assert shift.proc.wait(60) == 1
    error = [line for line in (tmp_path / "shift.log").read_text().splitlines() if "cannot load the model" in line]
    assert len(error) == 1 and "context shift" in error[0] and "--swa-full" in error[0]


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_cache_memory_is_committed_as_used_and_can_be_capped(tmp_path):
    """-c 131072 reserves 512 MiB of cache for the demo model; an idle server holds
    about what a -c 4096 one holds (both layouts). --kv-cache-tokens caps the cache
    whatever -c says."""
    with ServerProcess("--metrics", "-np", "4", "-c", "4096", log=tmp_path / "small.log") as small:
        small.wait_ready()
        baseline = rss_mb(small.proc.pid)
    for layout in ("--kv-unified", "--no-kv-unified"):
        with ServerProcess("--metrics", "-np", "4", "-c", "131072", layout, log=tmp_path / "big.log") as big:
            big.wait_ready()
            (group,) = httpx.get(big.url + "/props").json()["memory"]["groups"]
            assert group["bytes_total"] >= 512 << 20
            assert rss_mb(big.proc.pid) < baseline + 64  # not the 512 MiB
    capped_args = ("-np", "4", "-c", "131072", "--kv-cache-tokens", "512", "--kv-unified")
    with InProcessServer.from_flags("--metrics", *capped_args, log=tmp_path / "cap.log") as capped:
        capped.wait_ready()
        (group,) = httpx.get(capped.url + "/props").json()["memory"]["groups"]
        assert group["n_blocks_total"] == 512 // 16 + 4  # one pool of 512 cells (+ a partial block per slot)
        assert {s["n_ctx"] for s in httpx.get(capped.url + "/slots").json()} == {512}
        too_long = httpx.post(capped.url + "/completion", json={"prompt": [5] * 600, "n_predict": 1}, timeout=60)
        assert too_long.status_code == 400
