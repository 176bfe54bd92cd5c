"""llama-server's native completion (``/completion``, ``/infill``): prompts given as
ids run as one batch of runs and answered in llama-server's shapes."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from server.errors import APIError
from server.pipeline.generation import LLAMA_DEFAULTS, build_request
from server.pipeline.native_answer import NativeAnswer
from server.pipeline.run_batch import run_batch
from server.pipeline.sse import SSEResponse, sse_frames
from server.schemas.requests import NativeCompletionRequest


async def complete(
    http: HTTPRequest, body: NativeCompletionRequest, prompts: list[list[int]], batch: bool, media: list | None = None
) -> Response:
    """llama-server's native answer (a list when ``batch``) for prompts given as ids
    (``media``: each prompt's images, engine MediaItems).
    The body's ``n_cmpl`` (or ``n``; at most the number of slots): each prompt comes
    that many times in a row, completed as llama-server's child tasks are (a seed given
    is moved by one per child; no pinned slot), and the answer is a list. Every prompt
    is checked before any runs; they are admitted as slots free up
    (server/pipeline/run_batch.py), and a stream starts with the first."""
    state = http.app.state.slotserve
    engine = state.require_ready()
    n_cmpl = body.n_cmpl if body.n_cmpl is not None else body.n
    if n_cmpl > state.settings.parallel:
        raise APIError(400, f"n_cmpl: at most the number of slots ({state.settings.parallel})")
    media = media or [[] for _ in prompts]
    if n_cmpl > 1:
        prompts, batch = [p for p in prompts for _ in range(n_cmpl)], True
        media = [m for m in media for _ in range(n_cmpl)]
    reqs = [await _request(state, body, ids, i % n_cmpl) for i, ids in enumerate(prompts)]
    for req, items in zip(reqs, media):
        req.media = list(items)
    for req in reqs:
        engine.validate(req)
    runs = run_batch(state, http, reqs, engine.n_slots)
    if body.sse_ping_interval is not None:
        runs.runs[0].ping_interval = body.sse_ping_interval
    if not await runs.open_first():
        return Response(status_code=499)
    answer = NativeAnswer(state, body, engine)
    if body.stream:
        frames = sse_frames(runs.events(), lambda i, e: answer.frame(runs.runs[i], i, e))
        return SSEResponse(frames, runs.runs, on_close=runs.close)
    try:
        if not await runs.collect():
            return Response(status_code=499)
    finally:
        await runs.close()
    results = await asyncio.to_thread(lambda: [answer.final(run, i) for i, run in enumerate(runs.runs)])
    return JSONResponse(results if batch else results[0])


async def _request(state, body: NativeCompletionRequest, ids: list[int], child: int):
    """The engine request of one prompt; ``child`` > 0: an ``n_cmpl`` child (its own
    seed, any slot)."""
    requested = None if body.n_predict < 0 else body.n_predict
    req = await build_request(state, body, ids, requested, body.n_probs or None, LLAMA_DEFAULTS)
    if child:
        child_seed = body.seed + child if body.seed not in (None, -1) else None
        req.params, req.id_slot = dataclasses.replace(req.params, seed=child_seed), None
    req.progress = body.return_progress and body.stream
    return req
