"""Server-sent events: frames, the error frame, and a response that closes its run."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from engine.request import Failed
from server.generation import Run

log = logging.getLogger("slotserve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """An SSE stream that closes its run however the stream ends (client gone included).

    A client that stops reading blocks our writes once the socket buffers are full:
    when one write waits longer than ``--stall-timeout``, the request is cancelled and
    the connection closed (one log line), so a stuck reader holds no slot and no memory
    for long. Meanwhile its run buffers at most ``Run.MAX_BUFFERED`` events."""

    def __init__(self, frames: AsyncIterator[str], run: Run):
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.run.close()

    async def stream_response(self, send) -> None:
        stall = self.run.state.settings.stall_timeout
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for frame in self.body_iterator:
            try:
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": frame.encode(), "more_body": True}), stall
                )
            except TimeoutError:
                log.info("request %d: the client read nothing for %g s; cancelled", self.run.req.id, stall)
                return  # the response stays incomplete: the server closes the connection
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def sse_error(failure: Failed) -> str:
    """The last frame of a stream that failed after its first byte."""
    return sse({"error": {"message": failure.message, "type": failure.type, "code": failure.status}})
