"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from engine import Delta, Engine, Progress, TokenLogprob
from server import __version__
from server.errors import APIError
from server.pipeline.chat_output import ChatAnswer
from server.pipeline.chat_prompt import chat_template, render_chat, uses_tools
from server.pipeline.generation import (
    OPENAI_DEFAULTS,
    build_request,
    check_text_fits,
    decode,
    encode,
    prompt_ids,
)
from server.pipeline.native_answer import verbose_answer
from server.pipeline.reasoning import opens_thinking
from server.pipeline.run import Choice, Run
from server.pipeline.sse import SSEResponse, run_events, sse, sse_frames
from server.pipeline.thinking_budget import budget_spec
from server.pipeline.tool_calls import family, forced_grammar
from server.schemas.answers import ChatCompletion, Completion, ModelList, documented
from server.schemas.requests import ChatCompletionRequest, CompletionRequest, NamedToolChoice, OpenAIFields

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


async def _start(
    http: HTTPRequest, body: OpenAIFields, ids: list[int], max_tokens, logprobs, forced=None, budget=None
) -> Run:
    state = http.app.state.slotserve
    engine = state.require_ready()
    req = await build_request(state, body, ids, max_tokens, logprobs, OPENAI_DEFAULTS, forced, budget)
    run = Run(state, http, req)
    run.req_timings = body.timings_per_token
    if body.sse_ping_interval is not None:
        run.ping_interval = body.sse_ping_interval
    run.req.progress = body.return_progress and body.stream
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


async def _stream(
    run: Run, head: dict, include_usage: bool, render, first: list | None = None, verbose=None
) -> AsyncIterator[str]:
    """SSE frames: ``first`` (choice objects sent before any token), then ``render(delta)``
    for each delta; then usage, [DONE]. ``verbose()``: llama-server's ``__verbose``, on the
    chunk that finishes the (first) choice."""
    usage = {"usage": None} if include_usage else {}
    for choice in first or []:
        yield sse({**head, "choices": [choice], **usage})

    def frame(_: int, event) -> dict | None:
        if isinstance(event, Progress):  # llama-server's: a role-only chunk carrying prompt_progress
            opening = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
            timings = {"timings": run.progress_timings(event)} if run.req_timings else {}
            return {**head, "choices": [opening], **usage, "prompt_progress": run.progress(event), **timings}
        choice = render(event)
        if choice is None:
            return None
        timings = {"timings": run.timings()} if run.req_timings or event.finished else {}
        extra = {"__verbose": verbose()} if verbose and event.finished and event.index == 0 else {}
        return {**head, "choices": [choice], **usage, **timings, **extra}

    def tail() -> list[str]:
        last = [sse({**head, "choices": [], "usage": run.usage(), "timings": run.timings()})] if include_usage else []
        return [*last, sse("[DONE]")]

    async for text in sse_frames(run_events(run), frame, tail):
        yield text


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
        return SSEResponse(_stream(run, head, include, render, verbose=_verbose_now(state, engine, body, run)), run)

    await run.collect()

    def choice(c: Choice) -> dict:
        lps = _completion_logprobs(engine, c.logprobs, len(echo)) if body.logprobs is not None else None
        return {"index": c.index, "text": echo + c.text, "logprobs": lps, "finish_reason": c.finish_reason}

    choices = await asyncio.to_thread(lambda: [choice(c) for c in run.choices])  # logprob pieces: many decodes
    return JSONResponse({**head, "choices": choices, "usage": run.usage(), **await _verbose(state, engine, body, run)})


@router.post(
    "/v1/chat/completions", response_model=None, responses=documented(ChatCompletion, *GENERATE_ERRORS, stream=True)
)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    prompt, ids = await chat_prompt(state, engine, body)
    budget = budget_spec(state, engine, body, prompt)
    run = await _start(http, body, ids, _chat_max_tokens(body), _chat_top(body), _forced_call(engine, body), budget)
    if run is None:
        return Response(status_code=499)
    head = _header("chat.completion", state.settings.model_name, engine)
    tool_format = family(chat_template(engine).source) if uses_tools(body) else None
    fmt = body.reasoning_format or state.settings.reasoning_format
    logprob = (lambda lp: _chat_logprob(engine, lp)) if body.logprobs else None
    answer = ChatAnswer(body.n, fmt, opens_thinking(prompt), tool_format, logprob)
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        chunk_head = {**head, "object": "chat.completion.chunk"}
        verbose = _verbose_now(state, engine, body, run)
        return SSEResponse(_stream(run, chunk_head, include, answer.delta, answer.opening(), verbose), run)
    await run.collect()
    choices = await asyncio.to_thread(lambda: [answer.choice(c) for c in run.choices])  # logprobs: many decodes
    return JSONResponse({**head, "choices": choices, "usage": run.usage(), **await _verbose(state, engine, body, run)})


def _verbose_now(state, engine, body: OpenAIFields, run: Run):
    """For a stream: a function giving ``__verbose`` when it is on (None when off)."""
    on = state.settings.verbose if body.verbose is None else body.verbose
    return (lambda: verbose_answer(state, engine, run)) if on else None


async def _verbose(state, engine, body: OpenAIFields, run: Run) -> dict:
    """``__verbose`` as llama-server adds it with ``-v`` (or the request's ``verbose``)."""
    on = state.settings.verbose if body.verbose is None else body.verbose
    return {"__verbose": await asyncio.to_thread(verbose_answer, state, engine, run)} if on else {}


async def chat_prompt(state, engine, body: ChatCompletionRequest) -> tuple[str, list[int]]:
    check_text_fits(engine, sum(len(m.text()) for m in body.messages))
    if body.continue_final_message and "add_generation_prompt" in body.model_fields_set and body.add_generation_prompt:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true")
    prompt = await render_chat(engine, body, state.settings.template_kwargs, state.settings.prefill_assistant)
    return prompt, await encode(engine, prompt, add_special=True)  # BOS where the tokenizer adds it


def _chat_max_tokens(body: ChatCompletionRequest) -> int | None:
    return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens


def _chat_top(body: ChatCompletionRequest) -> int | None:
    return (body.top_logprobs or 0) if body.logprobs else None


def _forced_call(engine, body: ChatCompletionRequest) -> tuple[str, str] | None:
    """The grammar that makes the answer a call, when tool_choice requires one."""
    choice = body.tool_choice
    if not body.tools or choice in (None, "none", "auto"):
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise APIError(400, "tool_choice: the request has no tools")
        return None
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        if not tools:
            raise APIError(400, f"tool_choice: no tool named {choice.function.name!r}")
    fmt = family(chat_template(engine).source)
    return "lark", forced_grammar(fmt, tools, body.parallel_tool_calls)


@router.post("/v1/chat/completions/input_tokens", response_model=None, responses=documented(None, 400, 413, 503))
@router.post("/chat/completions/input_tokens", include_in_schema=False)
async def chat_input_tokens(body: ChatCompletionRequest, http: HTTPRequest) -> dict:
    """How many tokens the chat request's prompt is (llama-server's token counting)."""
    state = http.app.state.slotserve
    engine = state.require_ready()
    _, ids = await chat_prompt(state, engine, body)
    req = await build_request(
        state, body, ids, _chat_max_tokens(body), _chat_top(body), OPENAI_DEFAULTS, _forced_call(engine, body)
    )
    engine.validate(req)
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
