"""llama-server's MCP CORS proxy (``--ui-mcp-proxy``; experimental there, and off by
default in both): ``GET`` and ``POST /cors-proxy?url=URL`` send the request on to URL and
stream its answer back, so a web page can talk to an MCP server that sends no CORS
headers.

- Off: 403, as llama-server. On: behind the API key, as every API route.
- Only the headers a client names as ``x-llama-server-proxy-header-NAME`` go out (as
  ``NAME``): the caller's ``Authorization``, ``X-Api-Key`` and cookies never leave.
- ``http`` and ``https`` URLs only, without credentials in them: 400 otherwise
  (llama-server answers 500); an upstream that cannot be reached is a 502.
- The upstream's hop-by-hop, length and CORS headers are dropped: the body is streamed
  as it comes, and this server's CORS middleware answers for itself.
- Targets are checked after DNS resolution, and again at every redirect (followed here,
  at most ``MAX_REDIRECTS``): a loopback, link-local (169.254.169.254, the cloud
  metadata service), private, multicast, reserved or unspecified address is refused
  with 403 unless ``--ui-mcp-proxy-private`` (an MCP server on this machine or the LAN).
  The connection goes to the address that was checked (no second lookup a rebinding
  DNS could answer differently); ``Host`` is always the target's own, never the caller's.
- An answer is cut at ``MAX_ANSWER_BYTES``; the upstream gets ``TIMEOUT``; the upstream
  connection is closed however the answer ends (finished, cut, client gone).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator
from urllib.parse import urljoin, urlsplit

import httpx
from fastapi import APIRouter, Query
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from server.errors import APIError

log = logging.getLogger("slotserve")
PREFIX = "x-llama-server-proxy-header-"
DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection"})
NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"})
TIMEOUT = httpx.Timeout(120.0, connect=10.0)  # 2 minutes without a byte ends it (llama-server: 10)
MAX_ANSWER_BYTES = 64 << 20
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})

router = APIRouter()


def _target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise APIError(400, f"unsupported URL scheme in target URL: {parts.scheme or '(none)'}")
    if not parts.hostname:
        raise APIError(400, "invalid target URL: missing host")
    if parts.password is not None or parts.username is not None:
        raise APIError(400, "authentication in target URL is not supported")
    return url


def forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why the proxy does not go to ``ip`` by default (None: a public address)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for why in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{why}"):
            return why.replace("_", "-")
    return None if ip.is_global else "non-global"  # shared (100.64/10) and the like


async def _pinned(url: str, allow_private: bool) -> tuple[str, dict, dict]:
    """``url`` with its host replaced by the address it resolves to (checked), the
    ``Host`` header and the TLS name that go with it."""
    parts = urlsplit(_target(url))
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise APIError(502, f"the proxied server's name cannot be resolved: {host}", "server_error") from exc
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addresses:
        why = forbidden(ip)
        if why and not allow_private:
            raise APIError(
                403,
                f"the proxy does not reach {why} addresses ({host} is {ip}): start with --ui-mcp-proxy-private",
                "permission_error",
            )
    ip = addresses[0]
    netloc = f"[{ip}]" if ip.version == 6 else str(ip)
    pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return pinned, {"Host": host_header}, ({"sni_hostname": host} if parts.scheme == "https" else {})


def _outgoing(http: HTTPRequest) -> dict[str, str]:
    """The headers the client asked to send, their prefix taken off (never ``Host`` or
    framing headers: those are the proxy's own)."""
    out = {}
    for k, v in http.headers.items():
        name = k[len(PREFIX) :] if k.lower().startswith(PREFIX) else ""
        if name and name.lower() not in NOT_FORWARDED:
            out[name] = v
    return out


async def _open(client: httpx.AsyncClient, http: HTTPRequest, method: str, url: str) -> httpx.Response:
    """The upstream's answer, redirects followed (each target checked)."""
    allow_private = http.app.state.slotserve.settings.ui_mcp_proxy_private
    body = await http.body() if method == "POST" else None
    headers = _outgoing(http)
    for _ in range(MAX_REDIRECTS + 1):
        pinned, host, tls = await _pinned(url, allow_private)
        request = client.build_request(method, pinned, headers={**headers, **host}, content=body, extensions=tls)
        try:
            upstream = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise APIError(502, f"the proxied server cannot be reached: {type(exc).__name__}", "server_error") from exc
        location = upstream.headers.get("location")
        if upstream.status_code not in REDIRECTS or not location:
            return upstream
        await upstream.aclose()
        url = urljoin(url, location)
        if upstream.status_code == 303 or (upstream.status_code in (301, 302) and method == "POST"):
            method, body = "GET", None
    raise APIError(502, f"the proxied server redirected more than {MAX_REDIRECTS} times", "server_error")


async def _capped(upstream: httpx.Response, close) -> AsyncIterator[bytes]:
    """The upstream's body as it comes, cut at ``MAX_ANSWER_BYTES``; closed at the end
    whatever ends it."""
    sent = 0
    try:
        async for chunk in upstream.aiter_raw():
            sent += len(chunk)
            if sent > MAX_ANSWER_BYTES:
                log.info("cors-proxy: the answer passed %d bytes; cut", MAX_ANSWER_BYTES)
                return
            yield chunk
    finally:
        await close()


async def _forward(http: HTTPRequest, method: str, url: str) -> StreamingResponse:
    if not http.app.state.slotserve.settings.ui_mcp_proxy:
        raise APIError(403, "the CORS proxy is off: start the server with --ui-mcp-proxy", "permission_error")
    client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
    try:
        upstream = await _open(client, http, method, url)
    except BaseException:
        await client.aclose()
        raise
    closed = False

    async def close() -> None:
        nonlocal closed
        if not closed:
            closed = True
            await upstream.aclose()
            await client.aclose()

    try:
        declared = int(upstream.headers.get("content-length", "0"))
    except ValueError:
        declared = 0
    if declared > MAX_ANSWER_BYTES:
        await close()
        raise APIError(502, f"the proxied answer is larger than {MAX_ANSWER_BYTES} bytes", "server_error")
    kept = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in DROPPED and not k.lower().startswith("access-control-")
    }
    return StreamingResponse(
        _capped(upstream, close), upstream.status_code, headers=kept, background=BackgroundTask(close)
    )


@router.get("/cors-proxy", include_in_schema=False)
async def proxy_get(http: HTTPRequest, url: str = Query("")) -> StreamingResponse:
    return await _forward(http, "GET", url)


@router.post("/cors-proxy", include_in_schema=False)
async def proxy_post(http: HTTPRequest, url: str = Query("")) -> StreamingResponse:
    return await _forward(http, "POST", url)
