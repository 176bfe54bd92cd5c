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
from waiting import wait_for

from server.pipeline import outbound
from server.routes import cors_proxy

KEY = "sk-proxy"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Upstream(BaseHTTPRequestHandler):
    """Records each request; ``/stream`` writes one chunk, then waits for the test's go."""

    def do_GET(self):
        self.server.seen.append(("GET", dict(self.headers), b""))
        if self.path.startswith("/to/"):  # a redirect to the URL after /to/
            self.send_response(302)
            self.send_header("Location", self.path[len("/to/") :])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/big":  # a chunked answer of 1 MiB: no length to refuse it by
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(16):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the proxy cut it
            return
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
    yield from _upstream("127.0.0.1")


@pytest.fixture(scope="module")
def public_upstream():
    """An upstream on 127.0.0.2, which the tests below let pass for a public address."""
    yield from _upstream("127.0.0.2")


def _upstream(address: str):
    server = ThreadingHTTPServer((address, 0), Upstream)
    server.seen, server.go = [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.go.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy():
    with InProcessServer(api_key=KEY, ui_mcp_proxy=True, ui_mcp_proxy_private=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def strict():
    """The proxy as it starts by default: no private targets."""
    with InProcessServer(ui_mcp_proxy=True) as srv:
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


@pytest.mark.parametrize(
    "host, why",
    [
        ("127.0.0.1", "loopback"),
        ("localhost", "loopback"),  # after DNS
        ("[::1]", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_private_targets_are_refused_by_default(strict, upstream, host, why):
    n_seen = len(upstream.seen)
    port = upstream.server_port if host in ("127.0.0.1", "localhost") else 80
    r = httpx.get(strict.url + "/cors-proxy", params={"url": f"http://{host}:{port}/capture"}, timeout=30)
    assert r.status_code == 403 and why in r.json()["error"]["message"], r.text
    assert "--ui-mcp-proxy-private" in r.json()["error"]["message"]
    assert len(upstream.seen) == n_seen


def test_a_redirect_to_a_private_target_is_refused(strict, upstream, public_upstream, monkeypatch):
    real = outbound.forbidden
    monkeypatch.setattr(outbound, "forbidden", lambda ip: None if str(ip) == "127.0.0.2" else real(ip))
    public = f"http://127.0.0.2:{public_upstream.server_port}"
    assert httpx.get(strict.url + "/cors-proxy", params={"url": public + "/capture"}).text == "ok"
    inside = f"http://127.0.0.1:{upstream.server_port}/capture"
    n_seen = len(upstream.seen)
    r = httpx.get(strict.url + "/cors-proxy", params={"url": f"{public}/to/{inside}"}, timeout=30)
    assert r.status_code == 403 and "loopback" in r.json()["error"]["message"]
    assert len(upstream.seen) == n_seen
    followed = httpx.get(strict.url + "/cors-proxy", params={"url": f"{public}/to/{public}/capture"}, timeout=30)
    assert followed.status_code == 200 and followed.text == "ok"  # a public redirect is followed


def test_host_is_never_the_callers(proxy, upstream):
    url = f"http://127.0.0.1:{upstream.server_port}/capture"
    headers = {**AUTH, "x-llama-server-proxy-header-host": "internal.example"}
    assert httpx.get(proxy.url + "/cors-proxy", params={"url": url}, headers=headers).status_code == 200
    assert lower(upstream.seen[-1][1])["host"] == f"127.0.0.1:{upstream.server_port}"


class CountingClient(httpx.AsyncClient):
    opened = closed = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CountingClient.opened += 1

    async def aclose(self):
        if not self.is_closed:
            CountingClient.closed += 1
        await super().aclose()


def test_an_answer_is_capped_and_the_upstream_closed_on_every_path(proxy, upstream, monkeypatch):
    monkeypatch.setattr(cors_proxy.httpx, "AsyncClient", CountingClient)
    monkeypatch.setattr(cors_proxy, "MAX_ANSWER_BYTES", 100_000)
    base = f"http://127.0.0.1:{upstream.server_port}"
    big = httpx.get(proxy.url + "/cors-proxy", params={"url": base + "/big"}, headers=AUTH, timeout=30)
    assert len(big.content) <= 100_000 + 65536  # cut after the chunk that passed the cap
    ok = httpx.get(proxy.url + "/cors-proxy", params={"url": base + "/capture"}, headers=AUTH, timeout=30)
    assert ok.text == "ok"
    upstream.go.clear()
    with httpx.stream("GET", proxy.url + "/cors-proxy", params={"url": base + "/stream"}, headers=AUTH) as r:
        next(r.iter_raw())  # the client leaves in the middle of the stream
    upstream.go.set()
    bad = httpx.get(proxy.url + "/cors-proxy", params={"url": f"http://127.0.0.1:{free_port()}/"}, headers=AUTH)
    assert bad.status_code == 502
    assert CountingClient.opened == 4
    wait_for(lambda: CountingClient.closed == CountingClient.opened, what="every upstream client closed")
