"""Slot files through a real server: save, restore, erase, listing; validation leaves
everything unchanged; busy slots; a restore in a new process continues exactly; a
conversation moves between two replicas that share the slot folder."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from server_proc import InProcessServer
from waiting import wait_for

from engine import Engine
from memory import SeqState
from memory.files.slot_file import decode, encode

N_SLOTS = 4


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(save_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "server.log"
    with InProcessServer.from_flags("-np", str(N_SLOTS), "--slot-save-path", str(save_dir), log=log) as srv:
        srv.wait_ready()
        yield srv


@pytest.fixture(scope="module")
def tokenizer():
    return Engine.from_pretrained().tokenizer


def action(srv, slot, name: str, filename: str | None = None, **params) -> httpx.Response:
    body = {"filename": filename} if filename is not None else None
    return httpx.post(f"{srv.url}/slots/{slot}", params={"action": name, **params}, json=body, timeout=120)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def complete(srv, prompt, n: int, id_slot: int, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "id_slot": id_slot, **kw}
    return ok(httpx.post(srv.url + "/completion", json=body, timeout=120))


def slot_cached(srv) -> list[int]:
    return [s["n_cached"] for s in httpx.get(srv.url + "/slots").json()]


def dir_digest(folder: Path, skip: set[str] = frozenset()) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.name not in skip}


def read_file(folder: Path, name: str):
    return decode((folder / name).read_bytes())


def same_cache(a, b) -> bool:
    return a.tokens == b.tokens and all(torch.equal(t, b.state.tensors[k]) for k, t in a.state.tensors.items())


def test_save_erase_restore_same_and_other_slot(server, save_dir):
    prompt = "The quick brown fox jumps over the lazy dog and"
    out = complete(server, prompt, 12, id_slot=0)
    n_slot = out["tokens_evaluated"] + 12 - 1  # the last sampled token is not in the cache
    saved = ok(action(server, 0, "save", "rt.slot"))
    assert saved["n_saved"] == n_slot and saved["n_written"] == (save_dir / "rt.slot").stat().st_size
    assert saved["timings"]["save_ms"] > 0
    assert ok(action(server, 0, "erase")) == {"id_slot": 0, "n_erased": n_slot}
    assert slot_cached(server)[0] == 0
    restored = ok(action(server, 0, "restore", "rt.slot"))
    assert restored["n_restored"] == n_slot and restored["n_read"] == saved["n_written"]
    assert slot_cached(server)[0] == n_slot
    ok(action(server, 3, "restore", "rt.slot"))
    again = complete(server, prompt, 12, id_slot=3)  # the restored cache serves the same prompt
    assert again["tokens_cached"] == out["tokens_evaluated"] - 1
    assert again["tokens"] == out["tokens"]


def test_bad_requests_are_4xx(server, save_dir):
    (save_dir / "a-directory").mkdir()
    cases = [
        (lambda: action(server, 0, "save", "a-directory"), 400, "invalid_filename"),
        (lambda: action(server, 0, "save", "../up"), 400, "invalid_filename"),
        (lambda: action(server, 0, "explode", "x"), 400, "invalid_action"),
        (lambda: action(server, "one", "save", "x"), 404, 404),  # /slots/{digits} only
        (lambda: action(server, N_SLOTS, "save", "x"), 400, "invalid_id_slot"),
        (lambda: action(server, -1, "erase"), 404, 404),
        (lambda: action(server, 0, "erase", ".bad"), 400, "invalid_filename"),  # checked for erase too
        (lambda: action(server, 0, "restore", "absent.slot"), 404, "file_not_found"),
        (lambda: httpx.delete(server.url + "/slots/files/absent.slot"), 404, "file_not_found"),
        (lambda: httpx.delete(server.url + "/slots/files/.hidden"), 400, "invalid_filename"),
    ]
    for call, status, code in cases:
        r = call()
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code
        assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert (save_dir / "a-directory").is_dir() and not (save_dir.parent / "up").exists()
    (save_dir / "a-directory").rmdir()


def test_every_bad_restore_leaves_slot_and_files_unchanged(server, save_dir, tmp_path):
    complete(server, "Slot one holds this conversation about ships.", 8, id_slot=1)
    ok(action(server, 1, "save", "before.slot"))
    good = (save_dir / "before.slot").read_bytes()
    fp = read_file(save_dir, "before.slot").fingerprint
    header_len = int.from_bytes(good[:8], "little")
    flipped = bytearray(good)
    flipped[8 + header_len + (len(good) - 8 - header_len) // 2] ^= 0x10
    file = decode(good)
    n_ctx = httpx.get(server.url + "/slots").json()[1]["n_ctx"]
    big = SeqState(
        torch.arange(n_ctx + 1),
        {k: t[:1].expand(n_ctx + 1, *t.shape[1:]) for k, t in file.state.tensors.items()},
        file.state.meta,
    )
    outside = tmp_path / "outside.slot"
    outside.write_bytes(good)
    (save_dir / "escape.slot").symlink_to(outside)
    bad_files = {
        "other-model.slot": encode(file.tokens, file.state, {**fp, "weights_sha256": "0" * 64}),
        "other-arch.slot": encode(file.tokens, file.state, {**fp, "architecture": "Qwen3ForCausalLM"}),
        "truncated.slot": good[: len(good) // 2],
        "flipped.slot": bytes(flipped),
        "vocab.slot": encode([10**6] * len(file.tokens), file.state, fp),
        "too-long.slot": encode([1] * (n_ctx + 1), big, fp),
        "far.slot": encode(
            file.tokens, SeqState(file.state.positions + 10**12, file.state.tensors, file.state.meta), fp
        ),
        "negative.slot": encode(
            file.tokens, SeqState(file.state.positions - 1, file.state.tensors, file.state.meta), fp
        ),
        "not-safetensors.slot": b"hello world" * 10,
    }
    for name, data in bad_files.items():
        (save_dir / name).write_bytes(data)
    files_before, cached_before = dir_digest(save_dir), slot_cached(server)
    names = [*bad_files, "escape.slot", "../outside.slot", "a/b", "..", ".hidden", "x" * 256, "tab\tname", ""]
    for name in names:
        r = action(server, 1, "restore", name)
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["message"]
    assert dir_digest(save_dir) == files_before
    assert slot_cached(server) == cached_before
    ok(action(server, 1, "save", "after.slot"))
    assert same_cache(read_file(save_dir, "before.slot"), read_file(save_dir, "after.slot"))
    assert httpx.get(server.url + "/props").json()["memory"]["integrity"] == "ok"
    for name in [*bad_files, "escape.slot", "after.slot"]:
        (save_dir / name).unlink()


def test_saving_a_busy_slot_snapshots_at_a_step_boundary(server, save_dir, tokenizer):
    prompt = tokenizer.encode("A long story about a lighthouse keeper who")
    n_gen = 300
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(complete(server, prompt, n_gen, id_slot=2)))
    worker.start()
    wait_for(lambda: httpx.get(server.url + "/slots").json()[2]["n_decoded"] >= 10 or not worker.is_alive())
    assert worker.is_alive()
    saved = ok(action(server, 2, "save", "busy.slot"))
    worker.join(60)
    assert result["tokens_predicted"] == n_gen  # the generation went on
    full = prompt + result["tokens"]
    n = saved["n_saved"]
    assert len(prompt) < n < len(prompt) + n_gen - 1
    assert read_file(save_dir, "busy.slot").tokens == full[:n]
    # the snapshot's cache is exactly the cache of those tokens: it continues the same way
    ok(action(server, 3, "restore", "busy.slot"))
    cont = complete(server, full[: n + 1], 8, id_slot=3)
    assert cont["tokens_cached"] == n
    assert cont["tokens"] == full[n + 1 : n + 9]


def test_restore_and_erase_wait_for_a_busy_slot(server, save_dir):
    saved = ok(action(server, 0, "save", "wait.slot"))
    done = threading.Event()
    threading.Thread(target=lambda: (complete(server, "Busy busy busy", 300, id_slot=2), done.set())).start()
    wait_for(lambda: httpx.get(server.url + "/slots").json()[2]["is_processing"])
    for r in (action(server, 2, "restore", "wait.slot", nowait=1), action(server, 2, "erase", nowait=1)):
        assert r.status_code == 409 and r.json()["error"]["code"] == "slot_busy"
    restored = ok(action(server, 2, "restore", "wait.slot"))  # waits for the generation to end
    assert done.wait(10)
    slot = httpx.get(server.url + "/slots").json()[2]
    assert not slot["is_processing"] and slot["n_cached"] == restored["n_restored"] == saved["n_saved"]


def test_concurrent_saves_of_different_slots(server, save_dir):
    for i in range(N_SLOTS):
        complete(server, f"Slot {i} says {'hello ' * (i + 1)}", 6, id_slot=i)
    expected = slot_cached(server)
    results: dict[int, dict] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.update({i: ok(action(server, i, "save", f"c{i}.slot"))}))
        for i in range(N_SLOTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    files = [read_file(save_dir, f"c{i}.slot") for i in range(N_SLOTS)]
    assert [results[i]["n_saved"] for i in range(N_SLOTS)] == expected == [len(f.tokens) for f in files]
    assert len({tuple(f.tokens) for f in files}) == N_SLOTS


def test_list_and_delete(server, save_dir):
    ok(action(server, 0, "save", "listed.slot"))
    file = read_file(save_dir, "listed.slot")
    (save_dir / "foreign.slot").write_bytes(encode(file.tokens, file.state, {**file.fingerprint, "dtype": "bfloat16"}))
    (save_dir / "README.txt").write_text("not a slot file")
    entries = {e["filename"]: e for e in ok(httpx.get(server.url + "/slots/files"))["data"]}
    assert "README.txt" not in entries
    listed, foreign = entries["listed.slot"], entries["foreign.slot"]
    assert listed["n_tokens"] == len(file.tokens) and listed["size"] == (save_dir / "listed.slot").stat().st_size
    assert listed["model_match"] is True and foreign["model_match"] is False
    assert listed["memory_kind"] == "kv_stream" and abs(listed["created"] - time.time()) < 120
    assert ok(httpx.delete(server.url + "/slots/files/listed.slot")) == {"filename": "listed.slot", "deleted": True}
    assert not (save_dir / "listed.slot").exists()
    r = httpx.delete(server.url + "/slots/files/README.txt")
    assert r.status_code == 400 and (save_dir / "README.txt").exists()
    (save_dir / "foreign.slot").unlink()
    (save_dir / "README.txt").unlink()


def test_restore_in_a_new_process_continues_exactly(server, save_dir, tokenizer, tmp_path):
    prompt = tokenizer.encode("def fibonacci(n):\n    ")
    first = complete(server, prompt, 16, id_slot=0)
    saved = ok(action(server, 0, "save", "continue.slot"))
    assert saved["n_saved"] == len(prompt) + 15
    args = ("-np", str(N_SLOTS), "--block-size", "32", "--slot-save-path", str(save_dir))  # another block layout
    with InProcessServer.from_flags(*args, log=tmp_path / "b.log") as other:
        other.wait_ready()
        assert ok(action(other, 2, "restore", "continue.slot"))["n_restored"] == saved["n_saved"]
        cont = complete(other, prompt + first["tokens"], 16, id_slot=2)
        assert saved["n_saved"] - 1 <= cont["tokens_cached"] <= saved["n_saved"]
        whole = complete(other, prompt, 32, id_slot=0, cache_prompt=False)  # the uninterrupted run
    assert first["tokens"] + cont["tokens"] == whole["tokens"]


def chat(srv, messages: list[dict], id_slot: int) -> dict:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, "id_slot": id_slot}
    return ok(httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120))


def test_a_conversation_saved_on_one_replica_continues_on_another(server, save_dir, tmp_path):
    """Two replicas share the slot folder (a ReadWriteMany volume in deploy/): the first
    turn runs on replica A, which saves the slot; replica B restores it and answers the
    second turn from the cache, with the very tokens A itself gives for that turn."""
    turns = [{"role": "user", "content": "Write a function that adds two numbers."}]
    first = chat(server, turns, id_slot=1)
    ok(action(server, 1, "save", "session-42.slot"))
    turns += [first["choices"][0]["message"], {"role": "user", "content": "Now make it subtract."}]
    args = ("-np", "2", "--slot-save-path", str(save_dir))
    with InProcessServer.from_flags(*args, log=tmp_path / "replica-b.log") as replica_b:
        replica_b.wait_ready()
        ok(action(replica_b, 0, "restore", "session-42.slot"))
        second_b = chat(replica_b, turns, id_slot=0)
    second_a = chat(server, turns, id_slot=1)
    cached = second_b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["total_tokens"] - 1  # the whole first turn came from the file
    assert second_b["choices"][0]["message"] == second_a["choices"][0]["message"]


def test_without_a_filename_a_slot_uses_its_own_file(server, save_dir):
    complete(server, "Default names are per slot", 4, id_slot=1)
    saved = ok(action(server, 1, "save"))
    assert saved["filename"] == "slot-1.slot" and (save_dir / "slot-1.slot").is_file()
    ok(action(server, 1, "erase"))
    assert ok(action(server, 1, "restore"))["n_restored"] == saved["n_saved"]
    (save_dir / "slot-1.slot").unlink()


def test_a_file_of_other_cache_types_is_refused_and_its_own_restores(server, save_dir, tokenizer, tmp_path):
    """A float32 server's file into a server storing q8_0 keys and f16 values: 400 naming
    the flag, the slot unchanged; that server's own files record its types and restore."""
    prompt = tokenizer.encode("class Stack:\n    def push(self, x):\n")
    complete(server, prompt, 8, id_slot=3)
    ok(action(server, 3, "save", "float32.slot"))
    args = ("-np", "2", "--slot-save-path", str(save_dir), "-ctk", "q8_0", "-ctv", "f16")
    with InProcessServer.from_flags(*args, log=tmp_path / "q8.log") as small:
        small.wait_ready()
        first = complete(small, prompt, 8, id_slot=0)
        before = slot_cached(small)
        r = action(small, 0, "restore", "float32.slot")
        assert r.status_code == 400 and "--cache-type-k" in r.json()["error"]["message"]
        assert slot_cached(small) == before
        ok(action(small, 0, "save", "q8.slot"))
        meta = read_file(save_dir, "q8.slot").state.meta
        assert (meta["k_type"], meta["v_type"]) == ("q8_0", "f16")
        ok(action(small, 1, "restore", "q8.slot"))
        cont = complete(small, prompt + first["tokens"], 8, id_slot=1)
        assert cont["tokens_cached"] >= len(prompt) + 7
        whole = complete(small, prompt + first["tokens"], 8, id_slot=0, cache_prompt=False)
        assert cont["tokens"] == whole["tokens"]  # a restored q8_0 cache is the cache it was
