"""A run answered in OpenAI's shapes, shared by completions and chat: the run started
from a body, the answer's header, llama-server's ``__verbose``, and the stream's chunks
as dicts (the chat route writes them as SSE; Anthropic and Responses rewrite them as
their own events, with no text parsed back)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request as HTTPRequest

from engine import Delta, Engine, Failed, Progress
from server import __version__
from server.pipeline.generation import OPENAI_DEFAULTS, build_request
from server.pipeline.native_answer import verbose_answer
from server.pipeline.run import Run
from server.pipeline.sse import run_events, sse, sse_fault
from server.schemas.requests import OpenAIFields

log = logging.getLogger("slotserve")


def piece(engine: Engine, token_id: int) -> str:
    return engine.tokenizer.decode([token_id], skip_special=False)


async def start_run(
    http: HTTPRequest,
    body: OpenAIFields,
    ids: list[int],
    max_tokens,
    logprobs,
    forced=None,
    budget=None,
    media=(),
    preserved: frozenset[int] = frozenset(),
    turn_start: int | None = None,
) -> Run | None:
    """The body's run, admitted (refusals raise APIError); None when the client left.
    ``media``: the prompt's images (engine MediaItems); ``preserved``: special tokens
    its text keeps; ``turn_start``: where a chat prompt's generation prompt begins."""
    state = http.app.state.slotserve
    engine = state.require_ready()
    req = await build_request(state, body, ids, max_tokens, logprobs, OPENAI_DEFAULTS, forced, budget, preserved)
    req.media, req.turn_start = list(media), turn_start
    run = Run(state, http, req)
    run.req_timings = body.timings_per_token
    if body.sse_ping_interval is not None:
        run.ping_interval = body.sse_ping_interval
    run.req.progress = body.return_progress and body.stream
    if not await run.open(engine):
        return None
    return run


def header(kind: str, model: str, engine) -> dict:
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    head = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}
    return {**head, "system_fingerprint": system_fingerprint(engine)}


def system_fingerprint(engine) -> str:
    """Which build served the model, and which weights: changes when either does."""
    return f"slotserve-{__version__}-{engine.fingerprint['weights_sha256'][:12]}"


def verbose_now(state, engine, body: OpenAIFields, run: Run) -> Callable[[], dict] | None:
    """For a stream: a function giving ``__verbose`` when it is on (None when off)."""
    on = state.settings.verbose if body.verbose is None else body.verbose
    return (lambda: verbose_answer(state, engine, run)) if on else None


async def verbose_of(state, engine, body: OpenAIFields, run: Run) -> dict:
    """``__verbose`` as llama-server adds it with ``-v`` (or the request's ``verbose``)."""
    on = state.settings.verbose if body.verbose is None else body.verbose
    return {"__verbose": await asyncio.to_thread(verbose_answer, state, engine, run)} if on else {}


async def chunks(
    run: Run,
    head: dict,
    include_usage: bool,
    render: Callable[[Delta], dict | None],
    first: list[dict] | None = None,
    verbose: Callable[[], dict] | None = None,
) -> AsyncIterator[dict]:
    """The stream's chunks: ``first`` (choice objects sent before any token), then
    ``render(delta)`` for each delta, then usage when asked. A failure ends it with
    ``{"error": ...}``. ``verbose()``: llama-server's ``__verbose``, on the chunk that
    finishes the (first) choice."""
    usage = {"usage": None} if include_usage else {}
    for choice in first or []:
        yield {**head, "choices": [choice], **usage}
    async for _, event in run_events(run):
        if isinstance(event, Failed):
            yield {"error": {"message": event.message, "type": event.type, "code": event.status}}
            return
        if isinstance(event, Progress):  # llama-server's: a role-only chunk carrying prompt_progress
            opening = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
            timings = {"timings": run.progress_timings(event)} if run.req_timings else {}
            yield {**head, "choices": [opening], **usage, "prompt_progress": run.progress(event), **timings}
            continue
        if not isinstance(event, Delta) or (choice := render(event)) is None:
            continue
        timings = {"timings": run.timings()} if run.req_timings or event.finished else {}
        extra = {"__verbose": verbose()} if verbose and event.finished and event.index == 0 else {}
        yield {**head, "choices": [choice], **usage, **timings, **extra}
    if include_usage:
        yield {**head, "choices": [], "usage": run.usage(), "timings": run.timings()}


async def sse_chunks(stream: AsyncIterator[dict]) -> AsyncIterator[str]:
    """OpenAI's SSE: each chunk a ``data:`` frame, then ``[DONE]`` (not after a failure
    the engine reported). A fault of ours while the chunks are made ends the stream
    with an error frame and ``[DONE]`` (a client waits for one or the other), logged."""
    try:
        async for chunk in stream:
            yield sse(chunk)
            if "error" in chunk:
                return
    except Exception as exc:  # noqa: BLE001 - the client gets a clean end; the log gets the fault
        log.exception("a stream failed mid-way")
        yield sse_fault(exc)
    yield sse("[DONE]")
