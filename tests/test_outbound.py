"""Requests the server sends out (image URLs with --media-urls; the MCP CORS proxy), each
against a real HTTP server on this machine: a whole-fetch deadline (a server that sends
a byte now and then), a decompressed-size limit kept while inflating (a gzip bomb), and
each address of a name tried in turn."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time
import tracemalloc

import pytest

from server.errors import APIError
from server.pipeline.outbound import fetch


class OneAnswer:
    """A loopback HTTP server that answers every connection with ``write(conn)``."""

    def __init__(self, write, host: str = "127.0.0.1"):
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.write, self.done = write, threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    self.write(conn)
                except OSError:
                    pass

    def close(self) -> None:
        self.done.set()
        self.sock.close()


def get(url: str, max_bytes: int = 1 << 20, timeout: float = 10.0) -> bytes:
    return asyncio.run(fetch(url, True, "the image fetch", "--media-urls-private", max_bytes, timeout))


def test_a_server_that_drips_bytes_meets_the_deadline():
    """A byte every 0.3 s for 6 s: the fetch ends at its 1.5 s deadline (a per-read
    timeout of 1.5 s alone would wait the 6 s out)."""

    def drip(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n")
        for _ in range(20):
            conn.sendall(b"x")
            time.sleep(0.3)

    server = OneAnswer(drip)
    try:
        with pytest.raises(APIError) as refused:
            get(f"http://127.0.0.1:{server.port}/cat.png", timeout=1.5)
        assert refused.value.status == 400 and "did not arrive within 1.5 s" in refused.value.message
    finally:
        server.close()


def test_a_gzip_bomb_is_refused_while_it_inflates():
    """256 MB of zeros, gzipped to ~250 KB: refused past the 1 MiB limit, and the fetch
    never holds more than a few MiB (it once inflated each received chunk whole)."""
    bomb = gzip.compress(bytes(256 << 20), compresslevel=9)

    def answer(conn):
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
        conn.sendall(head.encode() + bomb)

    server = OneAnswer(answer)
    try:
        tracemalloc.start()
        with pytest.raises(APIError) as refused:
            get(f"http://127.0.0.1:{server.port}/cat.png")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert "is larger than 1048576 bytes" in refused.value.message
        assert peak < 16 << 20, peak
    finally:
        server.close()
    small = gzip.compress(b"a small image")
    ok = OneAnswer(
        lambda conn: conn.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(small)}\r\n\r\n".encode() + small
        )
    )
    try:
        assert get(f"http://127.0.0.1:{ok.port}/cat.png") == b"a small image"
    finally:
        ok.close()


def test_each_address_of_a_name_is_tried(monkeypatch):
    """A name with two addresses, the first with nothing listening: the second answers."""
    server = OneAnswer(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ncat"))
    real = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def two(self, host, port, *args, **kwargs):
        if host != "two.test":
            return await real(self, host, port, *args, **kwargs)
        kind = socket.SOCK_STREAM
        return [(socket.AF_INET, kind, 6, "", ("127.0.0.3", port)), (socket.AF_INET, kind, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", two)
    try:
        assert get(f"http://two.test:{server.port}/cat.png") == b"cat"
    finally:
        server.close()


def test_the_ca_bundle_is_loaded_once_not_for_each_request(monkeypatch):
    """httpx loads the CA bundle for each client it builds with its default context
    (~80 ms of CPU on the event loop each time): image fetches share the process's
    one context (loaded on the first), and the router's calls to its children over
    their UNIX sockets load none."""
    import ssl
    from types import SimpleNamespace

    from server.pipeline import outbound
    from server.router.upstream import child_get

    loads = []
    real = ssl.SSLContext.load_verify_locations

    def counted(self, *args, **kwargs):
        loads.append(args or kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    outbound.tls.cache_clear()
    server = OneAnswer(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ncat"))
    try:
        assert [get(f"http://127.0.0.1:{server.port}/cat.png") for _ in range(3)] == [b"cat"] * 3
    finally:
        server.close()
    assert len(loads) == 1
    child = SimpleNamespace(socket="/nonexistent/child.sock", url="http://child", secret="s")
    assert [asyncio.run(child_get(child, "/ready", timeout=1)) for _ in range(3)] == [None] * 3  # nobody there
    assert len(loads) == 1
