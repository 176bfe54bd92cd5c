"""The router's data path to its children: aiohttp's client, whose HTTP parser is C
(httpx's h11 is Python; under load its per-chunk cost, on the cores the children
compute on, showed in their TTFT). One pool of keep-alive connections to the loopback
children; answers come back as they arrive, never buffered or decompressed.

The control path (a child's ``/ready``, ``/metrics``) stays on httpx."""

from __future__ import annotations

import asyncio

import aiohttp

HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"}
UpstreamError = (aiohttp.ClientError, OSError, asyncio.TimeoutError)  # the child did not answer


class Upstream:
    """Requests to children. ``open`` in the event loop that uses it, ``close`` at the end."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    async def send(
        self, method: str, url: str, query: list[tuple[str, str]], headers: dict[str, str], body: bytes
    ) -> aiohttp.ClientResponse:
        """The child's answer, its body still to read (``relay``). Raises one of
        UpstreamError when the child cannot be reached or closes before answering."""
        if self._session is None:
            await self.open()
        return await self._session.request(
            method, url, params=query, headers=headers, data=body or None, allow_redirects=False
        )

    @staticmethod
    def headers(response: aiohttp.ClientResponse) -> dict[str, str]:
        return {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
