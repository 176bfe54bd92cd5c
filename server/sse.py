"""Server-sent events: frames, the error frame, and a response that closes its run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from engine.request import Failed
from server.generation import Run

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """An SSE stream that closes its run however the stream ends (client gone included)."""

    def __init__(self, frames: AsyncIterator[str], run: Run):
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.run.close()


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def sse_error(failure: Failed) -> str:
    """The last frame of a stream that failed after its first byte."""
    return sse({"error": {"message": failure.message, "type": failure.type, "code": failure.status}})
