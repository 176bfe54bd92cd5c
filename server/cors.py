"""CORS as llama-server answers it, as plain ASGI middleware (outside the API-key check,
so a browser's preflight, which carries no credentials, is answered).

- A request with an ``Origin`` the server allows gets ``Access-Control-Allow-Origin``
  set to that origin (reflected, never ``*``, so credentials work) and
  ``Access-Control-Allow-Credentials: true``; errors (401s included) carry them too, so
  a page can read why it failed.
- A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed
  origin is answered 200 with the allowed methods and the requested headers; from
  another origin, 403 in the OpenAI error shape.
- Allowed: every origin (llama-server's default), or the ones ``--cors-origins`` lists
  (comma-separated or a JSON list, vLLM's ``--allowed-origins`` spelling accepted;
  ``*`` allows all).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError

METHODS = "GET, POST, PUT, DELETE, OPTIONS"
MAX_AGE = "600"


class CORSMiddleware:
    def __init__(self, app: ASGIApp, origins: frozenset[str] | None = None):
        """``origins``: the allowed ones; None (or one of them ``*``): all."""
        self.app = app
        self.origins = None if origins is None or "*" in origins else origins

    def allowed(self, origin: str) -> bool:
        return self.origins is None or origin in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if origin is None:
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(origin, headers, scope, receive, send)
        if not self.allowed(origin):
            return await self.app(scope, receive, send)  # no CORS headers: the browser keeps the answer from the page
        added = _cors_headers(origin)

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, origin: str, headers: dict, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.allowed(origin):
            error = APIError(403, f"origin '{origin}' is not allowed (see --cors-origins)", code="origin_not_allowed")
            return await error.response()(scope, receive, send)
        requested = headers.get("access-control-request-headers", "*") or "*"
        extra = [
            (b"access-control-allow-methods", METHODS.encode()),
            (b"access-control-allow-headers", requested.encode("latin-1")),
            (b"access-control-max-age", MAX_AGE.encode()),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": [*_cors_headers(origin), *extra]})
        await send({"type": "http.response.body", "body": b""})


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-credentials", b"true"),
        (b"vary", b"Origin"),
    ]


def parse_origins(value: str | None) -> frozenset[str] | None:
    """``--cors-origins``: comma-separated or a JSON list; empty or unset: all origins."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.startswith("["):
        import json

        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError("--cors-origins: a JSON value must be a list of strings")
    else:
        items = text.split(",")
    return frozenset(x.strip().rstrip("/") for x in items if x.strip())
