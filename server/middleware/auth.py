"""API-key check as plain ASGI middleware (so ``http.disconnect`` still reaches routes)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError, shaped


def _presented(scope: Scope) -> str | None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


def _matches(presented: str, keys: frozenset[str]) -> bool:
    """Constant time in the key's content: every configured key is compared, as bytes
    (``compare_digest`` refuses non-ASCII str, and a header may hold any latin-1 text)."""
    given = presented.encode("latin-1", "replace")
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key.encode("utf-8"))
    return matched


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: frozenset[str], public: Callable[[str], bool]):
        """``public(path)``: served without a key (server/middleware/paths.py)."""
        self.app = app
        self.keys = keys
        self.public = public

    def _open(self, scope: Scope) -> bool:
        return scope["method"] == "OPTIONS" or self.public(scope["path"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or self._open(scope):
            return await self.app(scope, receive, send)
        key = _presented(scope)
        if key is None or not _matches(key, self.keys):
            message = "missing API key" if key is None else "invalid API key"
            response = APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await shaped(scope["path"], response)(scope, receive, send)
        return await self.app(scope, receive, send)
