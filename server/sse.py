"""Server-sent events: frames, the error frame, and a response that closes its run."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from engine import Failed, RequestEvent
from server.run import Run

log = logging.getLogger("slotserve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """An SSE stream that closes its run however the stream ends (client gone included).

    A client that stops reading blocks our writes once the socket buffers are full:
    when one write waits longer than ``--stall-timeout``, the request is cancelled and
    the connection closed (one log line), so a stuck reader holds no slot and no memory
    for long. Meanwhile its run buffers at most ``Run.MAX_BUFFERED`` events."""

    def __init__(self, frames: AsyncIterator[str], runs: Run | list[Run]):
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self.runs = runs if isinstance(runs, list) else [runs]
        self.run = self.runs[0]

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for run in self.runs:
                await run.close()

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


async def merged_events(runs: list[Run]) -> AsyncIterator[tuple[int, RequestEvent]]:
    """(run index, event) of several runs as they come (one run: its events in order)."""
    if len(runs) == 1:
        async for event in runs[0].events():
            yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, run: Run) -> None:
        try:
            async for event in run.events():
                await queue.put((i, event))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(runs)]
    try:
        left = len(runs)
        while left:
            i, event = await queue.get()
            if event is None:
                left -= 1
            else:
                yield i, event
    finally:
        for task in tasks:
            task.cancel()


async def sse_frames(events: AsyncIterator[tuple[int, RequestEvent]], render, tail=None) -> AsyncIterator[str]:
    """The SSE frames of ``render(index, event)`` (None: no frame) for each event, then
    ``tail()``'s frames; a failure ends the stream with its error frame instead. Every
    streaming route uses this loop."""
    async for index, event in events:
        if isinstance(event, Failed):
            yield sse_error(event)
            return
        data = render(index, event)
        if data is not None:
            yield sse(data)
    for frame in tail() if tail else ():
        yield frame
