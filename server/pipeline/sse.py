"""Server-sent events: frames, the error frame, and a response that closes its run."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from engine import Failed, RequestEvent
from server.pipeline.run import Run

log = logging.getLogger("slotserve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """An SSE stream that closes its run however the stream ends (client gone included).

    A client that stops reading blocks our writes once the socket buffers are full:
    when one write waits longer than ``--stall-timeout``, the request is cancelled and
    the connection closed (one log line), so a stuck reader holds no slot and no memory
    for long. Meanwhile its run buffers at most ``Run.MAX_BUFFERED`` events."""

    def __init__(self, frames: AsyncIterator[str], runs: Run | list[Run], on_close=None):
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self.runs = runs if isinstance(runs, list) else [runs]
        self.run = self.runs[0]
        self._on_close = on_close  # an async callable run when the stream ends, however it ends

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                await self._on_close()
            for run in self.runs:
                await run.close()

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for frame in self._with_pings(self.body_iterator):
            if not await self._send_or_cut(send, frame.encode(), more=True):
                return
        if any(run.overflowed for run in self.runs):
            # the client fell a whole buffer behind: it got the error frame, and the
            # connection ends here instead of waiting on that reader for its next request
            log.info("request %d: the client fell behind its stream; connection closed", self.run.req.id)
            return
        await self._send_or_cut(send, b"", more=False)

    async def _with_pings(self, frames: AsyncIterator[str]) -> AsyncIterator[str]:
        """``frames``, with an SSE comment (``:``) whenever none came for
        ``--sse-ping-interval`` seconds (llama-server's ping: clients that time out a
        quiet connection, such as undici, keep it while a long prompt is computed)."""
        interval = self.run.ping_interval
        if interval <= 0:
            async for frame in frames:
                yield frame
            return
        it, step = aiter(frames), None
        try:
            while True:
                step = asyncio.ensure_future(anext(it))
                while not (await asyncio.wait({step}, timeout=interval))[0]:  # the same wait goes on: nothing lost
                    yield ":\n\n"
                try:
                    frame = step.result()
                except StopAsyncIteration:
                    return
                yield frame
        finally:
            if step is not None and not step.done():  # the stream was cut while waiting
                step.cancel()

    async def _send_or_cut(self, send, body: bytes, more: bool) -> bool:
        """One write within ``--stall-timeout``; False (and the response left incomplete,
        so the server closes the connection) when the client read nothing for that long."""
        stall = self.run.state.settings.stall_timeout
        try:
            await asyncio.wait_for(send({"type": "http.response.body", "body": body, "more_body": more}), stall)
        except TimeoutError:
            log.info("request %d: the client read nothing for %g s; cancelled", self.run.req.id, stall)
            return False
        return True


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def sse_error(failure: Failed) -> str:
    """The last frame of a stream that failed after its first byte."""
    return sse({"error": {"message": failure.message, "type": failure.type, "code": failure.status}})


def sse_fault(exc: BaseException) -> str:
    """The last frame of a stream a fault of ours ended (its type named, not its text)."""
    message = f"internal error while streaming: {type(exc).__name__}"
    return sse({"error": {"message": message, "type": "server_error", "code": 500}})


async def run_events(run: Run) -> AsyncIterator[tuple[int, RequestEvent]]:
    """(0, event) for each event of one run: the shape ``sse_frames`` reads (a batch of
    runs gives its own: server/pipeline/run_batch.py)."""
    async for event in run.events():
        yield 0, event


async def sse_frames(events: AsyncIterator[tuple[int, RequestEvent]], render, tail=None) -> AsyncIterator[str]:
    """The SSE frames of ``render(index, event)`` (None: no frame) for each event, then
    ``tail()``'s frames; a failure ends the stream with its error frame instead. Every
    streaming route uses this loop."""
    try:
        async for index, event in events:
            if isinstance(event, Failed):
                yield sse_error(event)
                return
            data = render(index, event)
            if data is not None:
                yield sse(data)
        for frame in tail() if tail else ():
            yield frame
    except Exception as exc:  # noqa: BLE001 - a fault of ours: the stream ends with its error frame
        log.exception("a stream failed mid-way")
        yield sse_fault(exc)
