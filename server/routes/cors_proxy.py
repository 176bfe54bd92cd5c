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

import logging
from collections.abc import AsyncIterator
from urllib.parse import urljoin

import httpx
from fastapi import APIRouter, Query
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from server.errors import APIError
from server.pipeline.outbound import MAX_REDIRECTS, REDIRECTS, send_pinned, tls

log = logging.getLogger("slotserve")
PREFIX = "x-llama-server-proxy-header-"
DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection"})
NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"})
TIMEOUT = httpx.Timeout(120.0, connect=10.0)  # 2 minutes without a byte ends it (llama-server: 10)
MAX_ANSWER_BYTES = 64 << 20

router = APIRouter()


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
        try:
            upstream = await send_pinned(
                client, method, url, allow_private, "the proxy", "--ui-mcp-proxy-private", headers=headers, content=body
            )
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
    client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, verify=tls())
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
