"""The runs of one HTTP request that asks for several (a list of prompts, ``n_cmpl``
children, embedding inputs), admitted as slots free up.

At most ``window`` runs (the slot count) are submitted at once; the next is submitted
when one ends. So a batch larger than ``--max-queue`` is served (LangChain sends 1,000
embedding inputs at a time), other clients' requests take freed slots in their turn,
and every open run is read while later ones wait (none fills its buffer unread).
A refusal or failure ends the whole batch: its open runs are cancelled and the rest are
never submitted.

Events of all runs reach the reader through one bounded queue: a reader that stops
stops the pumps, and each run's own buffer bound (``Run.MAX_BUFFERED``) then applies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request as HTTPRequest

from engine import Failed, Request, RequestEvent
from server.errors import APIError
from server.pipeline.run import Run
from server.state import ServerState

_ENDED = object()  # a pump's last item


def run_batch(state: ServerState, http: HTTPRequest, reqs: list[Request], window: int) -> RunBatch:
    """One run per request, admitted ``window`` at a time."""
    return RunBatch(state, [Run(state, http, req) for req in reqs], window)


class RunBatch:
    def __init__(self, state: ServerState, runs: list[Run], window: int):
        self.state = state
        self.runs = runs
        self.client_gone = False
        self._slots = asyncio.Semaphore(max(1, window))
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=max(1, window))
        self._pumps: list[asyncio.Task] = []

    async def open_first(self) -> bool:
        """Admit the first run before any answer starts, so that its refusal is the HTTP
        status (APIError raised); False when the client left while it waited."""
        await self._slots.acquire()
        try:
            opened = await self.runs[0].open(self.state.require_ready())
        except BaseException:
            self._slots.release()
            raise
        if not opened:
            self._slots.release()
            self.client_gone = True
        return opened

    async def events(self) -> AsyncIterator[tuple[int, RequestEvent]]:
        """(run index, event) of every run as they come, after ``open_first``. A later
        run refused at admission comes as its ``Failed`` event; after a ``Failed`` the
        batch is over."""
        self._pumps = [asyncio.create_task(self._pump(i)) for i in range(len(self.runs))]
        left = len(self.runs)
        try:
            while left:
                i, event = await self._queue.get()
                if event is _ENDED:
                    left -= 1
                    continue
                yield i, event
                if isinstance(event, Failed):
                    return
        finally:
            await self.close()

    async def collect(self) -> bool:
        """Run every run to its end; a failure becomes its HTTP error. False when the
        client left."""
        async for _, event in self.events():
            if isinstance(event, Failed):
                raise APIError(event.status, event.message, event.type, **event.extra)
        return not self.client_gone

    async def _pump(self, i: int) -> None:
        run, held = self.runs[i], i == 0  # open_first holds the first run's place
        try:
            refused = None
            if i > 0:
                await self._slots.acquire()
                held = True
                try:
                    opened = await run.open(self.state.require_ready())
                except APIError as exc:
                    refused, opened = Failed(exc.message, exc.type, exc.status, exc.extra), False
                if refused is not None:
                    await self._queue.put((i, refused))
                elif not opened:
                    self.client_gone = True
            if held and refused is None and not self.client_gone:
                async for event in run.events():
                    await self._queue.put((i, event))
                self.client_gone |= run.client_left
        finally:
            if held:
                self._slots.release()
        await self._queue.put((i, _ENDED))  # not reached when cancelled: nobody reads then

    async def close(self) -> None:
        """Idempotent: stop the pumps, cancel every run still open."""
        for pump in self._pumps:
            pump.cancel()
        for run in self.runs:
            await run.close()
