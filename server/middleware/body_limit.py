"""The body gate, as plain ASGI middleware (the model server's and the router's): a body
over ``max_bytes`` is answered 413 (OpenAI error shape) without reading the rest,
whether the client announced its length or streams it in chunks; a body holding a lone
UTF-16 surrogate escape is a 400 (server/middleware/surrogates.py). The body is read
here, then handed to the app as it came; every later ``receive`` (``http.disconnect``)
goes to the server as before."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError
from server.middleware.surrogates import lone_surrogate


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "TRACE"):
            return await self.app(scope, receive, send)
        announced = dict(scope.get("headers", [])).get(b"content-length")
        if announced is not None and (not announced.isdigit() or int(announced) > self.max_bytes):
            return await self._refuse(scope, receive, send, announced.isdigit())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left mid-body
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send, True)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        lone = lone_surrogate(body)
        if lone is not None:
            refusal = APIError(400, f"the request body holds {lone}, a lone UTF-16 surrogate: no text can hold it")
            return await refusal.response()(scope, _replay(body, receive), send)
        await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, too_large: bool) -> None:
        if too_large:
            error = APIError(413, f"the request body is larger than {self.max_bytes} bytes (--max-body-size)")
        else:
            error = APIError(400, "Content-Length is not a number")
        error.headers = {"Connection": "close"}  # the rest of the body is never read
        await error.response()(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
