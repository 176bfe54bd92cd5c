"""Cross-site request refusal, as plain ASGI middleware (inside CORS, so an allowed
page can read why it was refused).

A browser sends a "simple" POST to any site without asking first (no preflight): a
form or ``fetch`` with a ``text/plain``, form or multipart body. The routes read every
body as JSON whatever its type (server/middleware/json_body.py, for curl's ``-d``), so
without this a page on another site could restore or erase slots, change LoRA scales
or drive the CORS proxy of a server on the visitor's machine. Browsers always send
``Origin`` with such a request; curl and SDKs send none. Two rules, 403 when broken:

1. Any request but GET, HEAD and OPTIONS that carries an ``Origin`` other than this
   server's own (its web page) must come from an origin ``--cors-origins`` allows, with
   its body declared JSON: a JSON body needs a preflight, which CORS answers for
   allowed origins only.
2. The guarded paths (server/middleware/paths.py: slots, slot files, LoRA, the CORS
   proxy, the router's model loading), whatever the method, refuse a request from
   another site unless ``--cors-origins`` names its origin (``*``, the default, names
   none) or the server has an API key (then the key decides, and a page has none to
   send). "From another site": an ``Origin`` not this server's, or no ``Origin`` and a
   browser's ``Sec-Fetch-Site`` saying ``cross-site`` or ``same-site`` (an ``<img>``'s
   GET carries no ``Origin``). So a default start, which allows every origin to read
   completions, lets no page visited erase, restore or load anything.

(A page on a name that resolves to this host, DNS rebinding, passes as this server's
own: ``--api-key`` is the guard there.)"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError, shaped
from server.middleware.cors import CORSPolicy
from server.middleware.paths import rule

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
    def __init__(self, app: ASGIApp, policy: CORSPolicy, keys: bool):
        """``keys``: the server has an API key."""
        self.app = app
        self.policy = policy
        self.keys = keys

    def _guarded(self, origin: str | None, site: str | None) -> str | None:
        """Rule 2: why a guarded path refuses this request (None: it does not)."""
        if self.keys:
            return None
        if origin is None:
            if site in ("cross-site", "same-site"):
                return f"a request from another site ({site}) to this path needs an API key"
            return None
        if self.policy.origins is not None and self.policy.allow_origin(origin) is not None:
            return None
        return (
            f"cross-site request from origin {origin!r} refused: this path changes the server's state; "
            "name the origin in --cors-origins, or start the server with --api-key"
        )

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused (None: it is not)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if origin is not None and _same_origin(origin, headers.get("host")):
            return None  # this server's own web page
        if rule(scope["path"]).guarded and scope["method"] != "OPTIONS":
            if (why := self._guarded(origin, headers.get("sec-fetch-site"))) is not None:
                return why
        if scope["method"] in SAFE_METHODS or origin is None:
            return None  # rule 1 is for a browser's page sending a body
        if self.policy.allow_origin(origin) is None:
            return f"cross-site request from origin {origin!r} refused: it is not allowed by --cors-origins"
        if not _is_json(headers.get("content-type")):
            return "a request sent from a web page must declare its body JSON (Content-Type: application/json)"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (why := self._refusal(scope)) is not None:
            return await shaped(scope["path"], APIError(403, why, "permission_error"))(scope, receive, send)
        await self.app(scope, receive, send)
