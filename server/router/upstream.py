"""The router's way to its children, each behind its own UNIX socket and secret key.

The data path is aiohttp's client, whose HTTP parser is C (httpx's h11 is Python; under
load its per-chunk cost, on the cores the children compute on, showed in their TTFT):
a pool of keep-alive connections per child; answers come back as they arrive, never
buffered or decompressed. The control path (a child's ``/ready``, ``/metrics``,
``/props``) is httpx.

What crosses: a client's request less its hop-by-hop headers, its credentials (the
router checked them; the child takes its own key, put on here) and its ``Origin`` (the
router's CORS and cross-site rules decided); a child's answer less its hop-by-hop and
CORS headers (the router's own CORS headers go on once)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import httpx
import yarl

HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"}
NOT_FORWARDED = HOP_HEADERS | {"authorization", "x-api-key", "origin", "cookie"}
UpstreamError = (aiohttp.ClientError, OSError, asyncio.TimeoutError)  # the child did not answer


def auth(child) -> dict[str, str]:
    return {"Authorization": f"Bearer {child.secret}"}


def forwarded(headers, child) -> dict[str, str]:
    """A client's request headers as the child gets them."""
    return {**{k: v for k, v in headers.items() if k.lower() not in NOT_FORWARDED}, **auth(child)}


async def child_get(child, path: str, timeout: float) -> httpx.Response | None:
    """GET ``path`` of the child over its socket (control path); None when it does not answer."""
    # a UNIX socket: no TLS, so no CA bundle loaded for each call (httpx's default: ~80 ms
    # of CPU on the router's loop, for each poll of a loading model's /ready, 20 a second)
    transport = httpx.AsyncHTTPTransport(uds=child.socket, verify=False)
    try:
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            return await client.get(child.url + path, headers=auth(child))
    except (httpx.HTTPError, OSError):
        return None


class Upstream:
    """Requests to children. Used in one event loop; ``close`` at the end."""

    def __init__(self) -> None:
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def _session(self, socket: str) -> aiohttp.ClientSession:
        session = self._sessions.get(socket)
        if session is None:
            session = self._sessions[socket] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=socket, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return session

    async def send(
        self, child, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str], body: bytes
    ) -> aiohttp.ClientResponse:
        """The child's answer, its body still to read (``relay``); ``path`` percent-encoded,
        sent as it is (server/router/forward_path.py). Raises one of UpstreamError when
        the child cannot be reached or closes before answering."""
        return await self._session(child.socket).request(
            method,
            yarl.URL(child.url + path, encoded=True),
            params=query,
            headers=forwarded(headers, child),
            data=body or None,
            allow_redirects=False,
        )

    @staticmethod
    def headers(response: aiohttp.ClientResponse) -> dict[str, str]:
        """The child's answer headers the client gets (not its CORS ones: the router's go on)."""
        return {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in HOP_HEADERS and not k.lower().startswith("access-control-")
        }

    def forget(self, child) -> None:
        """The child's server is gone: its connections close (in the background)."""
        session = self._sessions.pop(child.socket, None)
        if session is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: closed with the rest
                asyncio.get_running_loop().create_task(session.close())

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
