"""Every POST body read as JSON, as plain ASGI middleware."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class JSONBodyMiddleware:
    """Every POST body is JSON, whatever Content-Type the client sent (curl -d sends a
    form type; llama-server parses JSON regardless). Pages on other sites cannot use
    this to skip a preflight: server/middleware/cross_site.py refuses them first."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
