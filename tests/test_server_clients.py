"""Slow and many clients: a reader that stops reading, and a thousand idle
connections beside a burst of requests."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from checkpoints import make_checkpoint
from server_proc import ServerProcess, metric
from waiting import wait_for


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One whole HTTP/1.1 response with a Content-Length: (status line, body). TCP may
    split the head and the body into separate segments, so read until both are in."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 12)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = dict(ln.partition(b":")[::2] for ln in lines[1:])
    length = int(next(v for k, v in fields.items() if k.strip().lower() == b"content-length"))
    while len(body) < length:
        chunk = sock.recv(1 << 12)
        assert chunk, "connection closed mid-body"
        body += chunk
    assert len(body) == length, "more bytes than one response"
    return lines[0], body


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("m") / "ckpt", "llama", max_position_embeddings=8192)


@pytest.mark.parametrize("stall", ["1", "600"])
def test_a_client_that_stops_reading_is_cut_and_slows_nobody(long_model, stall):
    """8 choices with 20 logprobs each fill the ~3 MB of socket buffers in a few hundred
    steps; then the server's writes block. With --stall-timeout 1 it cancels after a
    second of blocked writes; with 600 the run's buffer of events fills first, and the
    request is cancelled with an error frame. Either way the connection is closed (not
    kept alive for a reader that fell behind)."""
    args = ("-m", str(long_model), "-np", "9", "-c", "24000", "--stall-timeout", stall)
    with ServerProcess("--metrics", *args) as srv:
        srv.wait_ready()
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        reader.connect(("127.0.0.1", srv.port))
        body = b'{"prompt": "def f():", "max_tokens": 2400, "n": 8, "logprobs": 20, "ignore_eos": true, "stream": true}'
        reader.sendall(http_request("POST", "/v1/completions", body))
        wait_for(lambda: any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json()))
        other = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 50}, timeout=60)
        assert other.status_code == 200 and other.json()["usage"]["completion_tokens"] == 50  # others go on
        wait_for(lambda: not any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json()), 180)
        assert max(s["n_cached"] for s in httpx.get(srv.url + "/slots").json()) < 2400  # cut before its end
        assert metric(srv.url, "slotserve_requests_total", finish_reason="abort") == 1
        reader.settimeout(60)
        received = b""
        while chunk := reader.recv(1 << 16):  # the server closed the connection: reading ends
            received += chunk
        reader.close()
        assert b"the client did not read its stream" in received[-4096:] or stall == "1"
        assert not received.endswith(b"0\r\n\r\n")  # no end of the chunked body: cut
        assert httpx.get(srv.url + "/health").status_code == 200


def test_a_thousand_idle_connections_and_a_burst_get_answers_or_503s():
    with ServerProcess("--metrics", "-np", "8", "--max-queue", "16", "-t", "1") as srv:
        srv.wait_ready()
        idle = []
        for _ in range(1000):  # keep-alive connections that made one request and stay open
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(http_request("GET", "/health"))
            idle.append(s)
        for s in idle:
            s.settimeout(60)
            assert read_response(s) == (b"HTTP/1.1 200 OK", b'{"status":"ok"}')

        async def burst() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as client:
                body = {"prompt": "def f():", "max_tokens": 16, "ignore_eos": True}
                return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(200)))

        responses = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 8 + 16
        for r in responses:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1" and "--max-queue" in r.json()["error"]["message"]
            else:
                assert r.json()["usage"]["completion_tokens"] == 16
        for s in idle[:10]:  # the idle connections still work
            s.sendall(http_request("GET", "/health"))
            assert read_response(s) == (b"HTTP/1.1 200 OK", b'{"status":"ok"}')
        for s in idle:
            s.close()
