"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from engine import Delta, Engine, TokenLogprob
from server.errors import APIError
from server.pipeline.chat import chat_max_tokens, chat_prompt, chat_top, forced_call, open_chat
from server.pipeline.generation import OPENAI_DEFAULTS, build_request, decode, prompt_ids
from server.pipeline.openai_run import chunks, header, piece, sse_chunks, start_run, verbose_now, verbose_of
from server.pipeline.run import Choice
from server.pipeline.sse import SSEResponse
from server.schemas.answers import ChatCompletion, Completion, ModelList, documented
from server.schemas.requests import ChatCompletionRequest, CompletionRequest

router = APIRouter()


def _completion_logprobs(engine: Engine, lps: list[TokenLogprob], offset: int) -> dict:
    tokens, offsets = [], []
    for lp in lps:
        offsets.append(offset)
        tokens.append(piece(engine, lp.token_id))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{piece(engine, t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


GENERATE_ERRORS = (400, 413, 500, 503)


@router.post("/v1/completions", response_model=None, responses=documented(Completion, *GENERATE_ERRORS, stream=True))
async def completions(body: CompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (no prompt logprobs)")
    ids = await prompt_ids(engine, body.prompt)
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    run = await start_run(http, body, ids, max_tokens, body.logprobs)
    if run is None:
        return Response(status_code=499)
    head = header("text_completion", state.settings.model_name, engine)
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
        verbose = verbose_now(state, engine, body, run)
        return SSEResponse(sse_chunks(chunks(run, head, include, render, verbose=verbose)), run)

    await run.collect()

    def choice(c: Choice) -> dict:
        lps = _completion_logprobs(engine, c.logprobs, len(echo)) if body.logprobs is not None else None
        return {"index": c.index, "text": echo + c.text, "logprobs": lps, "finish_reason": c.finish_reason}

    choices = await asyncio.to_thread(lambda: [choice(c) for c in run.choices])  # logprob pieces: many decodes
    extra = await verbose_of(state, engine, body, run)
    return JSONResponse({**head, "choices": choices, "usage": run.usage(), **extra})


@router.post(
    "/v1/chat/completions", response_model=None, responses=documented(ChatCompletion, *GENERATE_ERRORS, stream=True)
)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    chat = await open_chat(http, body)
    if chat is None:
        return Response(status_code=499)
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        verbose = verbose_now(state, chat.engine, body, chat.run)
        return SSEResponse(sse_chunks(chat.stream(include, verbose)), chat.run)
    await chat.run.collect()
    choices = await chat.choices()
    extra = await verbose_of(state, chat.engine, body, chat.run)
    return JSONResponse({**chat.head, "choices": choices, "usage": chat.run.usage(), **extra})


@router.post("/v1/chat/completions/input_tokens", response_model=None, responses=documented(None, 400, 413, 503))
@router.post("/chat/completions/input_tokens", include_in_schema=False)
async def chat_input_tokens(body: ChatCompletionRequest, http: HTTPRequest) -> dict:
    """How many tokens the chat request's prompt is (llama-server's token counting)."""
    state = http.app.state.slotserve
    engine = state.require_ready()
    ids = (await chat_prompt(state, engine, body)).ids
    req = await build_request(
        state, body, ids, chat_max_tokens(body), chat_top(body), OPENAI_DEFAULTS, forced_call(engine, body)
    )
    engine.validate(req)
    return {"object": "response.input_tokens", "input_tokens": len(ids)}


@router.get("/v1/models", response_model=None, responses=documented(ModelList))
@router.get("/models", include_in_schema=False)
async def models(http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    model = state.engine or state.encoder
    meta = {"n_ctx": model.n_ctx, "n_vocab": model.vocab_size} if model else {}
    if state.encoder is not None:
        meta["n_embd"] = state.encoder.hidden_size
    entry = {
        "id": state.settings.model_name,
        "aliases": state.settings.model_aliases,
        "tags": state.settings.model_tags,
        "object": "model",
        "created": int(state.t_started),
        "owned_by": "slotserve",
        "meta": meta,
    }
    multimodal = state.engine is not None and state.engine.takes_images
    native = {  # llama-server's list beside OpenAI's
        "name": state.settings.model_name,
        "model": state.settings.model_name,
        "type": "model",
        "capabilities": _capabilities(state, multimodal),
        "details": {"format": "gguf" if str(state.settings.model).endswith(".gguf") else "safetensors"},
    }
    adapters = [  # each LoRA adapter as a model of its own (vLLM's listing): a request's model may name it
        {"id": name, "object": "model", "created": entry["created"], "owned_by": "slotserve", "parent": entry["id"]}
        for name in state.lora_names
    ]
    return {"object": "list", "data": [entry, *adapters], "models": [native]}


def _capabilities(state, multimodal: bool) -> list[str]:
    """What the model does, in llama-server's words (an encoder: embedding or rerank)."""
    if state.encoder is not None:
        return ["rerank"] if state.embedding_pooling == "rank" else ["embedding"]
    ranks = state.engine is not None and state.serves_embeddings and state.embedding_pooling == "rank"
    return ["completion"] + ["multimodal"] * multimodal + ["rerank"] * ranks
