"""Response header names in their usual spelling (``Access-Control-Allow-Origin``,
``Content-Type``): Starlette lowercases every name, which HTTP allows, but clients that
copy headers into a plain dict (llama.cpp's server tests, some proxies' scripts) then
miss them. Plain ASGI middleware, outermost: it rewrites the start message only."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def title_case(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


class HeaderCase:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def spelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(title_case(k), v) for k, v in message.get("headers", [])]}
            await send(message)

        await self.app(scope, receive, spelled)
