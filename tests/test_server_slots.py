"""Slots through a real server: concurrency, prefix reuse, pinning, cancellation; each
under both KV layouts (one unified pool, a stream per slot)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import pytest
from server_proc import InProcessServer
from waiting import wait_for

from engine import Engine

N_SLOTS = 4


@pytest.fixture(scope="module", params=["--kv-unified", "--no-kv-unified"])
def server(tmp_path_factory, request):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with InProcessServer.from_flags("--metrics", "-np", str(N_SLOTS), "-c", "4096", request.param, log=log) as srv:
        srv.wait_ready()
        yield srv


@pytest.fixture(scope="module")
def tokenizer():
    return Engine.from_pretrained().tokenizer


def slots(server) -> list[dict]:
    return httpx.get(server.url + "/slots").json()


def wait_idle(server, timeout: float) -> None:
    wait_for(lambda: not any(s["is_processing"] for s in slots(server)), timeout)


def complete(server, prompt, **kw) -> dict:
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 8, **kw}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_32_concurrent_streams_on_4_slots(server):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int, str]:
        body = {
            "prompt": f"def function_{i}(x):",
            "max_tokens": 16,
            "ignore_eos": True,
            "temperature": 0.8,
            "seed": i,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        n_chunks, usage, reason = 0, None, None
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event["choices"]:
                    n_chunks += 1
                    reason = event["choices"][0]["finish_reason"] or reason
                else:
                    usage = event["usage"]
        return n_chunks, usage["completion_tokens"], reason

    async def main():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(main())
    assert all(n_tokens == 16 and reason == "length" for _, n_tokens, reason in results)
    assert all(n_chunks >= 16 for n_chunks, _, _ in results)
    wait_idle(server, 30)
    info = slots(server)
    memory = httpx.get(server.url + "/props").json()["memory"]
    assert memory["integrity"] == "ok"
    (group,) = memory["groups"]
    held = sum(-(-s["n_cached"] // group["block_size"]) for s in info)
    assert group["n_blocks_used"] <= held  # only the idle slots' caches hold blocks


def test_prefix_reuse_and_cold_equality(server, tokenizer):
    text = "".join(f"def helper_{i}(value):\n    return value * {i}\n\n" for i in range(40))
    prefix = tokenizer.encode(text)[:200]
    tail_a, tail_b = tokenizer.encode("class Alpha:"), tokenizer.encode("import json\n")
    complete(server, prefix + tail_a)
    warm = complete(server, prefix + tail_b)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 190
    cold = complete(server, prefix + tail_b, cache_prompt=False)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]


def test_prefix_copied_from_busy_slot(server, tokenizer):
    text = "".join(f"class Widget{i}:\n    size = {i}\n\n" for i in range(30))
    prefix = tokenizer.encode(text)[:150]
    # more tokens than the context holds: slot 0 runs to its end (~870 tokens) unless the stream is left
    body = {"prompt": prefix + tokenizer.encode("x = 1"), "max_tokens": 100_000, "ignore_eos": True, "id_slot": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # slot 0 is now busy with the prefix
        assert slots(server)[0]["is_processing"]
        tail = tokenizer.encode("y = 2")
        warm = complete(server, prefix + tail, id_slot=1)
        assert slots(server)[0]["is_processing"]  # the copy came from a slot still generating
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 140
    cold = complete(server, prefix + tail, id_slot=2, cache_prompt=False)
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    wait_idle(server, 30)
    memory = httpx.get(server.url + "/props").json()["memory"]
    assert memory["integrity"] == "ok"
    (group,) = slots(server)[1]["cache"]  # what slot 1 holds, and how much of it slot 0 shares
    assert group["kind"] == "attention_full" and group["n_blocks"] >= (150 + 3) // 16
    if memory["layout"] == "unified":  # the copied prefix's full blocks are shared, not copied
        assert group["n_shared"] >= 140 // 16
    else:  # streams share nothing: the copy was a copy
        assert group["n_shared"] == 0


def test_pinned_request_waits_for_its_slot(server):
    done: dict[str, dict] = {}
    body = {"prompt": "def long():", "max_tokens": 1000, "ignore_eos": True, "id_slot": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        t = threading.Thread(target=lambda: done.setdefault("pinned", complete(server, "def short():", id_slot=2)))
        t.start()
        wait_for(lambda: "slotserve_requests_waiting 1.0" in httpx.get(server.url + "/metrics").text)
        free = complete(server, "def other():", max_tokens=2)  # an unpinned one does not wait
        assert free["usage"]["completion_tokens"] == 2
        assert "pinned" not in done  # slot 2 still runs the long stream (~1000 steps to go)
    t.join(30)  # leaving the stream cancelled it: the pinned request ran in slot 2
    assert done["pinned"]["usage"]["completion_tokens"] == 8
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "id_slot": N_SLOTS})
    assert r.status_code == 400 and "id_slot" in r.json()["error"]["message"]


def test_disconnect_frees_its_slot(server):
    body = {"prompt": "def forever():", "max_tokens": 1000, "ignore_eos": True, "id_slot": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert slots(server)[3]["is_processing"]
    wait_idle(server, 30)
    assert slots(server)[3]["n_cached"] < 1000  # it stopped early
    # non-streaming: the client gives up (its connection closed while the slot runs)
    payload = json.dumps({**body, "stream": False}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_for(lambda: slots(server)[3]["is_processing"], what="the request in slot 3")
    wait_idle(server, 30)
    assert slots(server)[3]["n_cached"] < 1000


def test_slot_files_need_a_save_path(server):
    for action in ("save", "restore", "erase"):
        r = httpx.post(f"{server.url}/slots/0", params={"action": action}, json={"filename": "x"})
        assert r.status_code == 501, r.text
        assert r.json()["error"]["type"] == "not_supported_error"
    assert httpx.get(server.url + "/slots/files").status_code == 501
