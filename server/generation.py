"""From a validated body to scheduler events and back: sampling parameters, the run of
one request (with client-disconnect watching), and the per-choice results."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request as HTTPRequest

from engine import SamplingParams
from engine.grammar import Constraint
from engine.request import (
    Admitted,
    Delta,
    Failed,
    QueueFull,
    Request,
    RequestError,
    RequestEvent,
    check_token_ids,
)
from engine.sequence import TokenLogprob
from engine.service import EngineService
from server.errors import APIError
from server.schemas import SamplingFields
from server.state import ServerState
from server.structured import constraint_of

log = logging.getLogger("slotserve")
LLAMA_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # llama-server's /completion
OPENAI_DEFAULTS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


async def build_request(
    state: ServerState,
    body: SamplingFields,
    ids: list[int],
    max_tokens: int | None,
    logprobs: int | None,
    defaults: dict,
    forced: tuple[str, str] | None = None,
) -> Request:
    """The engine request of a validated body (every generating route builds it here):
    the token limit resolved, the structured-output constraint compiled (``forced``:
    (kind, source) of a constraint the route imposes, e.g. a required tool call), the
    sampling parameters completed from the server's and the route's defaults."""
    engine = state.require_ready()
    n_tokens, given = resolve_max_tokens(max_tokens, state.settings.n_predict, len(ids), engine)
    constraint = await constraint_of(engine, body, forced)
    bias = await asyncio.to_thread(logit_bias, engine, body.logit_bias) if body.logit_bias else {}
    all_defaults = defaults | state.settings.sampling_defaults
    params = sampling_params(body, n_tokens, logprobs, all_defaults, constraint, bias)
    n = getattr(body, "n", 1)
    return Request(ids, params, n, body.id_slot, body.cache_prompt, body.n_keep, given)


def logit_bias(engine: EngineService, given: dict | list) -> dict[int, float]:
    """Each token's bias: ids as given, text on each of its tokens (llama-server's
    ``[["text", bias]]`` and ``{"text": bias}``), ``false`` as -inf (never sampled),
    ``true`` as no bias. Raises RequestError for an id outside the vocabulary."""
    out: dict[int, float] = {}
    for key, value in given.items() if isinstance(given, dict) else given:
        if value is True:
            continue
        if isinstance(key, int) or key.isdigit():
            ids = [int(key)]
        else:
            ids = engine.tokenizer.encode(key, add_special=False) if key else []
        check_token_ids(ids, engine.vocab_size, "logit_bias")
        out.update(dict.fromkeys(ids, float("-inf") if value is False else float(value)))
    return out


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    defaults: dict,
    constraint: Constraint | None = None,
    bias: dict[int, float] | None = None,
) -> SamplingParams:
    pick = lambda name: defaults[name] if getattr(body, name) is None else getattr(body, name)  # noqa: E731
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=pick("temperature"),
            top_k=pick("top_k"),
            top_p=max(pick("top_p"), 1e-9),
            min_p=pick("min_p"),
            seed=_seed(body.seed if body.seed is not None else defaults.get("seed")),
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=body.repetition_penalty or 1.0,
            logit_bias=bias or {},
            logprobs=logprobs,
            stop=tuple([body.stop] if isinstance(body.stop, str) else body.stop or ()),
            ignore_eos=body.ignore_eos,
            constraint=constraint,
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc


def _seed(seed: int | None) -> int | None:
    return None if seed in (None, -1) else seed


def resolve_max_tokens(requested: int | None, default: int, n_prompt: int, engine: EngineService) -> tuple[int, bool]:
    """(max_tokens, given): an open limit runs to the end of the slot's context."""
    if requested is None and default >= 0:
        requested = default
    if requested is not None:
        return requested, True
    room = engine.n_ctx - n_prompt
    return (1 << 30 if engine.context_shift else max(room, 0)), False


def check_text_fits(engine: EngineService, n_chars: int) -> None:
    """Refuse at once a text that cannot fit the slot's context whatever its tokens
    (more characters than the context's tokens can hold), before spending CPU on it."""
    n_ctx = engine.n_ctx
    if n_chars > n_ctx * engine.tokenizer.max_token_chars:
        raise APIError(
            400,
            f"the prompt has {n_chars} characters: more than a context of {n_ctx} tokens can hold",
            "exceed_context_size_error",
            n_ctx=n_ctx,
        )


async def encode(engine: EngineService, text: str, add_special: bool = True) -> list[int]:
    """Token ids of ``text``, encoded in a worker thread (the event loop never waits on it)."""
    return await asyncio.to_thread(engine.tokenizer.encode, text, add_special)


async def decode(engine: EngineService, ids: list[int], skip_special: bool = True) -> str:
    return await asyncio.to_thread(engine.tokenizer.decode, ids, skip_special)


async def prompt_ids(engine: EngineService, prompt: str | list[int | str]) -> list[int]:
    """A generation prompt as token ids: text is checked against the context, then
    encoded; text pieces among ids (llama-server's mixed prompt) are encoded in place."""
    if isinstance(prompt, str):
        check_text_fits(engine, len(prompt))
        return await encode(engine, prompt)
    if any(isinstance(x, str) for x in prompt):
        check_text_fits(engine, sum(len(x) for x in prompt if isinstance(x, str)))
        pieces = [[x] if isinstance(x, int) else await encode(engine, x, add_special=False) for x in prompt]
        prompt = [t for piece in pieces for t in piece]
    check_token_ids(prompt, engine.vocab_size)
    return list(prompt)


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_word: str | None = None
    truncated: bool = False

    def add(self, d: Delta) -> None:
        self.text += d.text
        if d.token_id is not None:
            self.token_ids.append(d.token_id)
        if d.logprob is not None:
            self.logprobs.append(d.logprob)
        if d.finished:
            self.finish_reason, self.stop_word, self.truncated = d.finish_reason, d.stop_word, d.truncated


async def _wait_disconnect(http: HTTPRequest) -> None:
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
        self.t0 = time.monotonic()  # arrival (same clock as the engine's event times)
        self._failed = False
        self._overflowed = False
        self._last_t: dict[int, float] = {}  # per choice: time of its last token
        self.req_timings = False  # llama-server's timings_per_token: timings in every stream chunk

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
        self._watch = asyncio.create_task(_wait_disconnect(self.http))
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

    def _client_gone(self, watch: asyncio.Task) -> None:
        if not watch.cancelled():
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
        a = self.admitted
        self.state.metrics.request_ended(
            self.outcome,
            len(self.req.prompt_ids),
            a.n_cached if a else 0,
            self.n_generated,
            self.t0,
            a.t if a else None,
            self.t_first,
            time.monotonic(),
        )

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
        }
