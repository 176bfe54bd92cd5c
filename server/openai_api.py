"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from engine import Engine
from engine.request import Delta, Failed, Request
from engine.sequence import TokenLogprob
from server import __version__
from server.chat_prompt import render_chat
from server.errors import APIError
from server.generation import (
    OPENAI_DEFAULTS,
    Choice,
    Run,
    check_text_fits,
    decode,
    encode,
    prompt_ids,
    resolve_max_tokens,
    sampling_params,
)
from server.responses import ChatCompletion, Completion, ModelList, documented
from server.schemas import ChatCompletionRequest, CompletionRequest, OpenAIFields
from server.sse import SSEResponse, sse, sse_error

router = APIRouter()


def _piece(engine: Engine, token_id: int) -> str:
    return engine.tokenizer.decode([token_id], skip_special=False)


def _chat_logprob(engine: Engine, lp: TokenLogprob) -> dict:
    def entry(tid: int, value: float) -> dict:
        text = _piece(engine, tid)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}


def _completion_logprobs(engine: Engine, lps: list[TokenLogprob], offset: int) -> dict:
    tokens, offsets = [], []
    for lp in lps:
        offsets.append(offset)
        tokens.append(_piece(engine, lp.token_id))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{_piece(engine, t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def _request(http: HTTPRequest, body: OpenAIFields, ids: list[int], max_tokens, logprobs) -> Request:
    state = http.app.state.slotserve
    engine = state.require_ready()
    n_tokens, given = resolve_max_tokens(max_tokens, state.settings.n_predict, len(ids), engine)
    params = sampling_params(body, engine, n_tokens, logprobs, OPENAI_DEFAULTS | state.settings.sampling_defaults)
    return Request(ids, params, body.n, body.id_slot, body.cache_prompt, body.n_keep, given)


async def _start(http: HTTPRequest, body: OpenAIFields, ids: list[int], max_tokens, logprobs) -> Run:
    state = http.app.state.slotserve
    engine = state.require_ready()
    run = Run(state, http, _request(http, body, ids, max_tokens, logprobs))
    if not await run.open(engine):
        return None
    return run


def _header(kind: str, model: str, engine) -> dict:
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    head = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}
    return {**head, "system_fingerprint": system_fingerprint(engine)}


def system_fingerprint(engine) -> str:
    """Which build served the model, and which weights: changes when either does."""
    return f"slotserve-{__version__}-{engine.fingerprint['weights_sha256'][:12]}"


async def _stream(run: Run, head: dict, include_usage: bool, render, first: list | None = None) -> AsyncIterator[str]:
    """SSE frames: ``first`` (choice objects sent before any token), then ``render(delta)``
    for each delta; then usage, [DONE]."""
    usage = {"usage": None} if include_usage else {}
    for choice in first or []:
        yield sse({**head, "choices": [choice], **usage})
    async for event in run.events():
        if isinstance(event, Failed):
            yield sse_error(event)
            return
        choice = render(event)
        if choice is not None:
            yield sse({**head, "choices": [choice], **({"usage": None} if include_usage else {})})
    if include_usage:
        yield sse({**head, "choices": [], "usage": run.usage()})
    yield sse("[DONE]")


GENERATE_ERRORS = (400, 413, 500, 503)


@router.post("/v1/completions", response_model=None, responses=documented(Completion, *GENERATE_ERRORS, stream=True))
async def completions(body: CompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (no prompt logprobs)")
    ids = await prompt_ids(engine, body.prompt)
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    run = await _start(http, body, ids, max_tokens, body.logprobs)
    if run is None:
        return Response(status_code=499)
    head = _header("text_completion", state.settings.model_name, engine)
    echo = await decode(engine, ids) if body.echo else ""

    if body.stream:
        offsets = [len(echo)] * body.n
        started = [False] * body.n

        def render(d: Delta) -> dict:
            text = d.text if started[d.index] else echo + d.text
            started[d.index] = True
            lps = None
            if body.logprobs is not None:
                lps = _completion_logprobs(engine, [d.logprob] if d.logprob else [], offsets[d.index])
            offsets[d.index] += len(text)
            return {"index": d.index, "text": text, "logprobs": lps, "finish_reason": d.finish_reason}

        include = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_stream(run, head, include, render), run)

    await run.collect()

    def choice(c: Choice) -> dict:
        lps = _completion_logprobs(engine, c.logprobs, len(echo)) if body.logprobs is not None else None
        return {"index": c.index, "text": echo + c.text, "logprobs": lps, "finish_reason": c.finish_reason}

    choices = await asyncio.to_thread(lambda: [choice(c) for c in run.choices])  # logprob pieces: many decodes
    return JSONResponse({**head, "choices": choices, "usage": run.usage()})


@router.post(
    "/v1/chat/completions", response_model=None, responses=documented(ChatCompletion, *GENERATE_ERRORS, stream=True)
)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    check_text_fits(engine, sum(len(m.text()) for m in body.messages))
    if body.continue_final_message and "add_generation_prompt" in body.model_fields_set and body.add_generation_prompt:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true")
    prompt = await render_chat(engine, body.messages, body.add_generation_prompt, body.continue_final_message)
    ids = await encode(engine, prompt, add_special=False)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    n_top = (body.top_logprobs or 0) if body.logprobs else None
    run = await _start(http, body, ids, max_tokens, n_top)
    if run is None:
        return Response(status_code=499)
    head = _header("chat.completion", state.settings.model_name, engine)

    if body.stream:

        def render(d: Delta) -> dict | None:
            delta: dict = {}
            if d.text or not d.finished:
                delta["content"] = d.text
            lps = {"content": [_chat_logprob(engine, d.logprob)]} if body.logprobs and d.logprob else None
            return {"index": d.index, "delta": delta, "logprobs": lps, "finish_reason": d.finish_reason}

        include = bool(body.stream_options and body.stream_options.include_usage)
        chunk_head = {**head, "object": "chat.completion.chunk"}
        opening = [  # as OpenAI and llama-server: the role first, no content yet
            {"index": i, "delta": {"role": "assistant", "content": None}, "logprobs": None, "finish_reason": None}
            for i in range(body.n)
        ]
        return SSEResponse(_stream(run, chunk_head, include, render, opening), run)

    await run.collect()

    def choice(c: Choice) -> dict:
        lps = {"content": [_chat_logprob(engine, lp) for lp in c.logprobs]} if body.logprobs else None
        message = {"role": "assistant", "content": c.text}
        return {"index": c.index, "message": message, "logprobs": lps, "finish_reason": c.finish_reason}

    choices = await asyncio.to_thread(lambda: [choice(c) for c in run.choices])  # logprob pieces: many decodes
    return JSONResponse({**head, "choices": choices, "usage": run.usage()})


@router.post("/v1/chat/completions/input_tokens", response_model=None, responses=documented(None, 400, 413, 503))
@router.post("/chat/completions/input_tokens", include_in_schema=False)
async def chat_input_tokens(body: ChatCompletionRequest, http: HTTPRequest) -> dict:
    """How many tokens the chat request's prompt is (llama-server's token counting)."""
    engine = http.app.state.slotserve.require_ready()
    check_text_fits(engine, sum(len(m.text()) for m in body.messages))
    prompt = await render_chat(engine, body.messages, body.add_generation_prompt, body.continue_final_message)
    ids = await encode(engine, prompt, add_special=False)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    engine.validate(_request(http, body, ids, max_tokens, (body.top_logprobs or 0) if body.logprobs else None))
    return {"object": "response.input_tokens", "input_tokens": len(ids)}


@router.get("/v1/models", response_model=None, responses=documented(ModelList))
@router.get("/models", include_in_schema=False)
async def models(http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    meta = {"n_ctx": state.engine.n_ctx, "n_vocab": state.engine.vocab_size} if state.engine else {}
    entry = {
        "id": state.settings.model_name,
        "aliases": state.settings.model_aliases,
        "tags": state.settings.model_tags,
        "object": "model",
        "created": int(state.t_started),
        "owned_by": "slotserve",
        "meta": meta,
    }
    return {"object": "list", "data": [entry]}
