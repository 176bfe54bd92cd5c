"""CORS with llama-server's semantics and flags, as plain ASGI middleware (outside the
API-key check, so a browser's preflight, which carries no credentials, is answered).

- ``--cors-origins``: ``*`` (default) allows every origin; ``localhost`` only origins
  whose host is localhost, 127.0.0.1 or ::1; otherwise a comma-separated list (or, as
  vLLM's ``--allowed-origins`` spells it, a JSON list).
- An allowed ``Origin`` is reflected in ``Access-Control-Allow-Origin`` (with
  ``--no-cors-credentials`` and ``*``, the literal ``*``); every answer carries it,
  errors and 401s included, so a page can read why it failed. A disallowed origin
  gets no CORS headers (the browser keeps the answer from the page).
- ``OPTIONS`` is a preflight: 200 with no body, ``Access-Control-Allow-Credentials``,
  ``-Methods`` (``--cors-methods``) and ``-Headers`` (``--cors-headers``), whatever the
  origin (llama-server answers the same way).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CORSPolicy:
    origins: frozenset[str] | None = None  # None: every origin; {"localhost"}: local origins only
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    def allow_origin(self, origin: str) -> str | None:
        """The Access-Control-Allow-Origin value for a request from ``origin`` (None: none)."""
        if self.origins is None:
            return origin if self.credentials else "*"
        if self.origins == frozenset({"localhost"}):
            return origin if _host(origin) in LOCAL_HOSTS else None
        return origin if origin.rstrip("/") in self.origins else None


def _host(origin: str) -> str | None:
    try:
        return urlsplit(origin).hostname
    except ValueError:
        return None


class CORSMiddleware:
    def __init__(self, app: ASGIApp, policy: CORSPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        allowed = self.policy.allow_origin(origin) if origin else None
        cors = [(b"access-control-allow-origin", allowed.encode("latin-1")), (b"vary", b"Origin")] if allowed else []
        if self.policy.credentials and allowed:
            cors.append((b"access-control-allow-credentials", b"true"))
        if scope["method"] == "OPTIONS":
            return await self._preflight(cors, send)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, cors: list, send: Send) -> None:
        p = self.policy
        extra = [
            (b"access-control-allow-credentials", b"true" if p.credentials else b"false"),
            (b"access-control-allow-methods", p.methods.encode("latin-1")),
            (b"access-control-allow-headers", p.headers.encode("latin-1")),
            (b"content-length", b"0"),
        ]
        cors = [h for h in cors if h[0] != b"access-control-allow-credentials"]
        await send({"type": "http.response.start", "status": 200, "headers": [*cors, *extra]})
        await send({"type": "http.response.body", "body": b""})


def parse_origins(value: str | None) -> frozenset[str] | None:
    """``--cors-origins``: ``*`` or unset: None (every origin); comma-separated or a JSON
    list otherwise. ValueError on a JSON value that is not a list of strings."""
    if value is None or not value.strip() or value.strip() == "*":
        return None
    text = value.strip()
    if text.startswith("["):
        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError("--cors-origins: a JSON value must be a list of strings")
    else:
        items = text.split(",")
    origins = frozenset(x.strip().rstrip("/") for x in items if x.strip())
    return None if "*" in origins else origins
