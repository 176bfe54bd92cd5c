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
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Query
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from server.errors import APIError

PREFIX = "x-llama-server-proxy-header-"
DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection"})
TIMEOUT = httpx.Timeout(600.0, connect=30.0)  # llama-server's 10 minutes to read and write

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


def _outgoing(http: HTTPRequest) -> dict[str, str]:
    """The headers the client asked to send, their prefix taken off."""
    return {k[len(PREFIX) :]: v for k, v in http.headers.items() if k.lower().startswith(PREFIX) and k[len(PREFIX) :]}


async def _forward(http: HTTPRequest, method: str, url: str) -> StreamingResponse:
    if not http.app.state.slotserve.settings.ui_mcp_proxy:
        raise APIError(403, "the CORS proxy is off: start the server with --ui-mcp-proxy", "permission_error")
    target = _target(url)
    body = await http.body() if method == "POST" else None
    client = httpx.AsyncClient(timeout=TIMEOUT)
    try:
        upstream = await client.send(
            client.build_request(method, target, headers=_outgoing(http), content=body), stream=True
        )
    except httpx.HTTPError as exc:
        await client.aclose()
        raise APIError(502, f"the proxied server cannot be reached: {type(exc).__name__}", "server_error") from exc
    kept = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in DROPPED and not k.lower().startswith("access-control-")
    }

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    return StreamingResponse(upstream.aiter_raw(), upstream.status_code, headers=kept, background=BackgroundTask(close))


@router.get("/cors-proxy", include_in_schema=False)
async def proxy_get(http: HTTPRequest, url: str = Query("")) -> StreamingResponse:
    return await _forward(http, "GET", url)


@router.post("/cors-proxy", include_in_schema=False)
async def proxy_post(http: HTTPRequest, url: str = Query("")) -> StreamingResponse:
    return await _forward(http, "POST", url)
