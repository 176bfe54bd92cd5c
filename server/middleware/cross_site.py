"""Cross-site request refusal, as plain ASGI middleware (inside CORS, so an allowed
page can read why it was refused).

A browser sends a "simple" POST to any site without asking first (no preflight): a
form or ``fetch`` with a ``text/plain``, form or multipart body. The routes read every
body as JSON whatever its type (server/middleware/json_body.py, for curl's ``-d``), so
without this a page on another site could restore or erase slots, change LoRA scales
or drive the CORS proxy of a server on the visitor's machine. Browsers always send
``Origin`` with such a request; curl and SDKs send none. So a request that changes
state (any method but GET, HEAD and OPTIONS) and carries an ``Origin`` other than this
server's own (its web page) is refused with 403 when ``--cors-origins`` does not allow
that origin, or when its body is not declared JSON: a JSON body needs a preflight, which
CORS answers for allowed origins only. (A page on a name that resolves to this host,
DNS rebinding, passes as this server's own: ``--api-key`` is the guard there.)"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError, shaped
from server.middleware.cors import CORSPolicy

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _same_origin(origin: str, host: str | None) -> bool:
    """``origin`` names the host (and port) the request was sent to: the web page."""
    try:
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class CrossSiteGuard:
    def __init__(self, app: ASGIApp, policy: CORSPolicy):
        self.app = app
        self.policy = policy

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused (None: it is not)."""
        if scope["method"] in SAFE_METHODS:
            return None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if origin is None:
            return None  # not sent by a browser's page
        if _same_origin(origin, headers.get("host")):
            return None  # this server's own web page
        if self.policy.allow_origin(origin) is None:
            return f"cross-site request from origin {origin!r} refused: it is not allowed by --cors-origins"
        if not _is_json(headers.get("content-type")):
            return "a request sent from a web page must declare its body JSON (Content-Type: application/json)"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (why := self._refusal(scope)) is not None:
            return await shaped(scope["path"], APIError(403, why, "permission_error"))(scope, receive, send)
        await self.app(scope, receive, send)
