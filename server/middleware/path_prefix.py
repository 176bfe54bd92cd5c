"""``--api-prefix``: every route served under a path prefix (llama-server's flag), as
ASGI middleware outside the others. A request whose path starts with the prefix is
routed without it (``root_path`` carries it, so generated URLs keep it); any other
path is a 404 in the OpenAI error shape."""

from __future__ import annotations

from server.errors import APIError


class PathPrefix:
    def __init__(self, app, prefix: str):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.prefix:
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path == self.prefix or path.startswith(self.prefix + "/"):
            root = scope.get("root_path", "") + self.prefix
            return await self.app({**scope, "path": path[len(self.prefix) :] or "/", "root_path": root}, receive, send)
        missing = APIError(404, f"not found: this server serves its routes under {self.prefix}")
        await missing.response()(scope, receive, send)
