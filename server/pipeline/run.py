"""One request's run: admission, its events as they arrive (with client-disconnect
watching), the per-choice results, usage and timings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request as HTTPRequest

from engine import (
    Admitted,
    Delta,
    EngineService,
    Failed,
    Progress,
    QueueFull,
    Request,
    RequestError,
    RequestEvent,
    TokenLogprob,
)
from server.errors import APIError
from server.state import ServerState

log = logging.getLogger("slotserve")


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_word: str | None = None
    truncated: bool = False
    n_drafted: int = 0  # speculative decoding (llama-server's timings.draft_n)
    n_draft_accepted: int = 0
    embedding: list[list[float]] | None = None  # an embedding request's pooled vector(s)

    def add(self, d: Delta) -> None:
        self.text += d.text
        if d.token_id is not None:
            self.token_ids.append(d.token_id)
        if d.logprob is not None:
            self.logprobs.append(d.logprob)
        self.n_drafted, self.n_draft_accepted = d.n_drafted, d.n_draft_accepted
        if d.finished:
            self.finish_reason, self.stop_word, self.truncated = d.finish_reason, d.stop_word, d.truncated
            self.embedding = d.embedding


async def wait_disconnect(http: HTTPRequest) -> None:
    """Returns when the client has gone (ASGI's ``http.disconnect``)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


class Run:
    """One request's events, ended early when the client goes away. ``open`` waits for
    admission so refusals and early failures become HTTP statuses.

    Events arrive in an asyncio.Queue fed by the scheduler on this loop. A watcher task
    waits for the ASGI ``http.disconnect`` message and then cancels the request and
    wakes the reader with ``None`` — at once, whether or not anyone is iterating (a
    response whose send failed stops iterating without closing its generator)."""

    def __init__(self, state: ServerState, http: HTTPRequest, req: Request):
        self.state, self.http, self.req = state, http, req
        self.admitted: Admitted | None = None
        self.choices = [Choice(i) for i in range(req.n)]
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._queue: asyncio.Queue[RequestEvent | None] = asyncio.Queue()
        self._engine: EngineService | None = None
        self._watch: asyncio.Task | None = None
        self._n_done = 0
        self._open = False
        self.t0 = req.t_arrival  # same clock as the engine's event times
        self._failed = False
        self._overflowed = False
        self._left = False
        self._last_t: dict[int, float] = {}  # per choice: time of its last token
        self.req_timings = False  # llama-server's timings_per_token: timings in every stream chunk
        self.ping_interval = state.settings.sse_ping_interval  # the request's sse_ping_interval, else the server's

    MAX_BUFFERED = 1024  # events waiting for a client that does not read; beyond: cancel

    async def open(self, engine: EngineService) -> bool:
        """False when the client left while waiting; raises APIError on refusal."""
        try:
            engine.submit(self.req, self._push)
        except RequestError as exc:
            raise APIError(400, str(exc), exc.type, **exc.extra) from exc
        except QueueFull as exc:
            raise APIError(503, str(exc), "unavailable_error", headers={"Retry-After": "1"}) from exc
        self._engine, self._open = engine, True
        self.state.n_inflight += 1
        self._watch = asyncio.create_task(wait_disconnect(self.http))
        self._watch.add_done_callback(self._client_gone)
        try:
            first = await self._queue.get()
        except BaseException:
            await self.close()
            raise
        if isinstance(first, Failed):
            self._failed = True
            await self.close()
            raise APIError(first.status, first.message, first.type, **first.extra)
        if first is None:
            await self.close()
            return False
        self.admitted = first
        return True

    def _push(self, event: RequestEvent) -> None:
        """The scheduler's sink (on the loop). A reader that falls ``MAX_BUFFERED`` events
        behind gets its request cancelled and, should it read again, an error event."""
        if self._overflowed:
            return
        if self._queue.qsize() >= self.MAX_BUFFERED:
            self._overflowed = True
            self._cancel()
            event = Failed("the client did not read its stream; the request was cancelled", "timeout_error", 408)
        self._queue.put_nowait(event)

    @property
    def overflowed(self) -> bool:
        """The client fell ``MAX_BUFFERED`` events behind and the request was cancelled."""
        return self._overflowed

    @property
    def client_left(self) -> bool:
        """The client went away while this run was open."""
        return self._left

    def _client_gone(self, watch: asyncio.Task) -> None:
        if not watch.cancelled():
            self._left = True
            self._queue.put_nowait(None)
            self._cancel()

    def _cancel(self) -> None:
        if self._engine is not None and self._n_done < self.req.n:
            self._engine.cancel(self.req.id)  # idempotent; a finished request ignores it

    async def events(self) -> AsyncIterator[Delta | Failed]:
        """The rest of the events; choices are updated as they pass."""
        try:
            while self._n_done < self.req.n:
                event = await self._queue.get()
                if event is None:
                    return
                if isinstance(event, Failed):  # counted before the caller may stop iterating
                    self._failed = True
                    self._n_done = self.req.n
                    yield event
                    return
                if isinstance(event, Delta):
                    self._on_delta(event)
                yield event
        finally:
            await self.close()

    def _on_delta(self, event: Delta) -> None:
        self.t_first = self.t_first or event.t
        self.t_last = event.t
        self.choices[event.index].add(event)
        self._n_done += event.finished
        if event.token_id is not None:
            last = self._last_t.get(event.index)
            if last is not None:
                self.state.metrics.itl.observe(max(0.0, event.t - last))
            self._last_t[event.index] = event.t

    async def collect(self) -> None:
        """Run to the end; a server-side failure becomes its HTTP error."""
        async for event in self.events():
            if isinstance(event, Failed):
                raise APIError(event.status, event.message, event.type)

    async def close(self) -> None:
        """Idempotent: stop watching, cancel the request if it is still running."""
        if not self._open:
            return
        self._open = False
        if self._watch is not None:
            self._watch.cancel()
        self._cancel()
        self.state.n_inflight -= 1
        if self.state.settings.log_prompts:
            self._log_text()

    def _log_text(self) -> None:
        """--log-prompts: the request's text in the log (off by default: prompts and
        completions are the users' data)."""
        tok = self.state.engine.tokenizer
        prompt = tok.decode(self.req.prompt_ids, skip_special=False)
        outputs = [c.text for c in self.choices]
        log.info("request %d (%s): prompt=%r completions=%r", self.req.id, self.outcome, prompt, outputs)

    @property
    def outcome(self) -> str:
        """stop | length (the first choice's reason), abort (cancelled, client gone) or error."""
        if self._overflowed:
            return "abort"
        if self._failed:
            return "error"
        reasons = [c.finish_reason for c in self.choices]
        if None in reasons or reasons[0] not in ("stop", "length"):
            return "abort"
        return reasons[0]

    @property
    def n_generated(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    def usage(self) -> dict:
        n_prompt = len(self.req.prompt_ids)
        n_cached = self.admitted.n_cached if self.admitted else 0
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": self.n_generated,
            "total_tokens": n_prompt + self.n_generated,
            "prompt_tokens_details": {"cached_tokens": n_cached},
        }

    def timings(self) -> dict:
        a = self.admitted
        n_prompt = len(self.req.prompt_ids) - (a.n_cached if a else 0)
        prompt_ms = ((self.t_first or a.t) - a.t) * 1000 if a else 0.0
        predicted_ms = ((self.t_last or 0) - (self.t_first or 0)) * 1000
        n_pred = max(self.n_generated - 1, 0)
        return {
            "cache_n": a.n_cached if a else 0,
            "prompt_n": n_prompt,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(n_prompt, 1),
            "prompt_per_second": n_prompt / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
            "predicted_n": self.n_generated,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(n_pred, 1),
            "predicted_per_second": n_pred / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
            **self._draft_timings(),
        }

    def progress_timings(self, event: Progress) -> dict:
        """``timings`` as they stand at a Progress event: the prompt so far, nothing predicted."""
        n_prompt, prompt_ms = event.n_processed - event.n_cached, (event.t - self.admitted.t) * 1000
        return {
            "cache_n": event.n_cached,
            "prompt_n": n_prompt,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(n_prompt, 1),
            "prompt_per_second": n_prompt / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
            "predicted_n": 0,
            "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0,
        }

    def progress(self, event: Progress) -> dict:
        """llama-server's ``prompt_progress`` for one Progress event."""
        return {
            "total": event.n_total,
            "cache": event.n_cached,
            "processed": event.n_processed,
            "time_ms": (event.t - self.admitted.t) * 1000,
        }

    def _draft_timings(self) -> dict:
        """llama-server's ``draft_n`` / ``draft_n_accepted``, when anything was proposed."""
        drafted = sum(c.n_drafted for c in self.choices)
        if not drafted:
            return {}
        return {"draft_n": drafted, "draft_n_accepted": sum(c.n_draft_accepted for c in self.choices)}
