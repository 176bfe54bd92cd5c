"""The MCP CORS proxy (``--ui-mcp-proxy``, server/routes/cors_proxy.py) against a real upstream
HTTP server: only the headers named ``x-llama-server-proxy-header-*`` leave, GET and
POST bodies and statuses pass through, the upstream's CORS and hop-by-hop headers do
not, an answer streams as the upstream writes it, and a server without the flag, a
caller without the key and a URL that is not plain http(s) are refused."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from server_proc import InProcessServer, free_port

KEY = "sk-proxy"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Upstream(BaseHTTPRequestHandler):
    """Records each request; ``/stream`` writes one chunk, then waits for the test's go."""

    def do_GET(self):
        self.server.seen.append(("GET", dict(self.headers), b""))
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in (b"data: first\n\n", b"data: second\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                self.server.go.wait(30)
            self.wfile.write(b"0\r\n\r\n")
            return
        self._answer(200, b"ok")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(("POST", dict(self.headers), body))
        self._answer(201, b'{"jsonrpc": "2.0", "id": 1, "result": {}}')

    def _answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Access-Control-Allow-Origin", "http://upstream.example")
        self.send_header("Mcp-Session-Id", "abc")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.seen, server.go = [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.go.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy():
    with InProcessServer(api_key=KEY, ui_mcp_proxy=True) as srv:
        yield srv


def lower(headers: dict) -> dict:
    return {k.lower(): v for k, v in headers.items()}


def test_only_the_named_headers_go_out_and_the_answer_comes_back(proxy, upstream):
    url = f"http://127.0.0.1:{upstream.server_port}"
    headers = {
        **AUTH,
        "Proxy-Authorization": "Basic secret",
        "X-Api-Key": KEY,
        "Cookie": "session=secret",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit",
    }
    r = httpx.get(proxy.url + "/cors-proxy", params={"url": url + "/capture"}, headers=headers, timeout=30)
    assert r.status_code == 200 and r.text == "ok"
    method, sent, _ = upstream.seen[-1]
    sent = lower(sent)
    assert method == "GET" and sent["accept"] == "application/json" and sent["authorization"] == "Bearer explicit"
    assert not {"proxy-authorization", "x-api-key", "cookie"} & set(sent)
    assert r.headers["mcp-session-id"] == "abc"  # the upstream's own headers come back
    assert "access-control-allow-origin" not in r.headers  # its CORS headers do not (no Origin was sent)
    posted = httpx.post(
        proxy.url + "/cors-proxy",
        params={"url": url + "/mcp"},
        content=b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}',
        headers={**AUTH, "x-llama-server-proxy-header-content-type": "application/json"},
        timeout=30,
    )
    assert posted.status_code == 201 and posted.json()["jsonrpc"] == "2.0"
    method, sent, body = upstream.seen[-1]
    assert method == "POST" and body == b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}'
    assert lower(sent)["content-type"] == "application/json"


def test_an_answer_streams_as_the_upstream_writes_it(proxy, upstream):
    url = f"http://127.0.0.1:{upstream.server_port}/stream"
    upstream.go.clear()
    with httpx.stream("GET", proxy.url + "/cors-proxy", params={"url": url}, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        chunks, got = r.iter_raw(), b""
        for chunk in chunks:
            got += chunk
            if b"data: first\n\n" in got:
                break
        assert b"second" not in got  # came while the upstream waits for the go: nothing is held back
        upstream.go.set()
        assert b"data: second" in got + b"".join(chunks)


def test_what_is_refused(proxy, demo_server, upstream):
    url = f"http://127.0.0.1:{upstream.server_port}/capture"
    off = httpx.get(demo_server.url + "/cors-proxy", params={"url": url})
    assert off.status_code == 403 and "--ui-mcp-proxy" in off.json()["error"]["message"]
    assert httpx.get(demo_server.url + "/props").json()["cors_proxy_enabled"] is False
    assert httpx.get(proxy.url + "/props", headers=AUTH).json()["cors_proxy_enabled"] is True
    assert httpx.get(proxy.url + "/cors-proxy", params={"url": url}).status_code == 401  # the key is asked
    n_seen = len(upstream.seen)
    for target, message in (
        ("file:///etc/passwd", "unsupported URL scheme"),
        ("gopher://127.0.0.1/", "unsupported URL scheme"),
        (f"http://user:pw@127.0.0.1:{upstream.server_port}/", "authentication in target URL"),
        ("http:///nohost", "missing host"),
        ("", "unsupported URL scheme"),
    ):
        r = httpx.get(proxy.url + "/cors-proxy", params={"url": target}, headers=AUTH)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (target, r.text)
    assert len(upstream.seen) == n_seen  # none of them went out
    closed = httpx.get(proxy.url + "/cors-proxy", params={"url": f"http://127.0.0.1:{free_port()}/"}, headers=AUTH)
    assert closed.status_code == 502 and closed.json()["error"]["type"] == "server_error"
