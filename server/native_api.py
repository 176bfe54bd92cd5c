"""llama-server's native routes: /completion, /tokenize, /detokenize, /apply-template,
/props, /slots."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from engine.request import Delta, Failed
from engine.service import SlotInfo
from server.chat_prompt import render_chat
from server.errors import APIError
from server.generation import (
    LLAMA_DEFAULTS,
    Run,
    build_request,
    decode,
    encode,
    prompt_ids,
)
from server.responses import (
    ApplyTemplateResult,
    DetokenizeResult,
    NativeCompletion,
    Props,
    TokenizeResult,
    documented,
)
from server.schemas import ApplyTemplateRequest, DetokenizeRequest, NativeCompletionRequest, TokenizeRequest
from server.sse import SSEResponse, sse, sse_error

router = APIRouter()


def _stop_type(reason: str | None, stop_word: str | None) -> str:
    if reason == "length":
        return "limit"
    if reason == "stop":
        return "word" if stop_word else "eos"
    return "none"


@router.post(
    "/completion", response_model=None, responses=documented(NativeCompletion, 400, 413, 500, 503, stream=True)
)
@router.post("/completions", include_in_schema=False)  # llama-server's native completion there too
async def completion(body: NativeCompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    ids = await prompt_ids(engine, body.prompt)
    requested = None if body.n_predict < 0 else body.n_predict
    req = await build_request(state, body, ids, requested, body.n_probs or None, LLAMA_DEFAULTS)
    params = req.params
    run = Run(state, http, req)
    if not await run.open(engine):
        return Response(status_code=499)
    id_slot = run.admitted.id_slots[0]

    def probs(lps) -> list[dict]:
        piece = lambda t: engine.tokenizer.decode([t], skip_special=False)  # noqa: E731
        return [
            {
                "id": lp.token_id,
                "token": piece(lp.token_id),
                "logprob": lp.logprob,
                "top_logprobs": [{"id": t, "token": piece(t), "logprob": v} for t, v in lp.top],
            }
            for lp in lps
        ]

    def final() -> dict:
        c = run.choices[0]
        extra = {"completion_probabilities": probs(c.logprobs)} if body.n_probs and not body.stream else {}
        return {
            **extra,
            "content": c.text if not body.stream else "",
            "tokens": c.token_ids if not body.stream else [],
            "id_slot": id_slot,
            "stop": True,
            "model": state.settings.model_name,
            "tokens_predicted": len(c.token_ids),
            "tokens_evaluated": len(ids),
            "tokens_cached": run.admitted.n_cached,
            "stop_type": _stop_type(c.finish_reason, c.stop_word),
            "stopping_word": c.stop_word or "",
            "truncated": False,
            "timings": run.timings(),
            "generation_settings": dataclasses.asdict(params),
        }

    if body.stream:

        async def frames():
            async for event in run.events():
                if isinstance(event, Failed):
                    yield sse_error(event)
                    return
                if isinstance(event, Delta) and not event.finished:
                    tokens = [event.token_id] if event.token_id is not None else []
                    yield sse({"content": event.text, "tokens": tokens, "id_slot": id_slot, "stop": False})
                elif isinstance(event, Delta):
                    tokens = [event.token_id] if event.token_id is not None else []
                    last = {**final(), "content": event.text, "tokens": tokens}
                    yield sse(last)

        return SSEResponse(frames(), run)

    await run.collect()
    return JSONResponse(await asyncio.to_thread(final))  # completion_probabilities: many decodes


@router.post("/tokenize", response_model=None, responses=documented(TokenizeResult, 400, 413, 503))
async def tokenize(body: TokenizeRequest, http: HTTPRequest) -> dict:
    engine = http.app.state.slotserve.require_ready()
    ids = await encode(engine, body.content, add_special=body.add_special)
    if not body.with_pieces:
        return {"tokens": ids}
    pieces = await asyncio.to_thread(lambda: [engine.tokenizer.decode([i], skip_special=False) for i in ids])
    return {"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces)]}


@router.post("/detokenize", response_model=None, responses=documented(DetokenizeResult, 400, 413, 503))
async def detokenize(body: DetokenizeRequest, http: HTTPRequest) -> dict:
    engine = http.app.state.slotserve.require_ready()
    vocab = engine.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"tokens: ids must be in [0, {vocab})")
    return {"content": await decode(engine, body.tokens, skip_special=False)}


@router.post("/apply-template", response_model=None, responses=documented(ApplyTemplateResult, 400, 413, 503))
async def apply_template(body: ApplyTemplateRequest, http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    engine = state.require_ready()
    return {"prompt": await render_chat(engine, body, state.settings.template_kwargs)}


@router.get("/props", response_model=None, responses=documented(Props, 503))
async def props(http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    engine = state.require_ready()
    memory = await engine.memory_report()
    tok = engine.tokenizer
    template = tok.chat_template
    return {
        "default_generation_settings": {"n_ctx": engine.n_ctx, "params": {**LLAMA_DEFAULTS, "n_predict": -1}},
        "total_slots": engine.n_slots,
        "model_path": str(state.settings.model),
        "model_alias": state.settings.model_name,
        "chat_template": template.source if template else "",
        "chat_template_name": template.name if template else None,
        "chat_template_kwargs": state.settings.template_kwargs,
        "reasoning_format": state.settings.reasoning_format,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "build_info": "slotserve",
        "is_sleeping": False,
        "memory": memory,
    }


@router.get("/slots", response_model=None, responses=documented(list[SlotInfo], 501, 503))
async def slots(http: HTTPRequest) -> list[dict]:
    state = http.app.state.slotserve
    if not state.settings.slots:
        raise APIError(501, "this server does not serve slot monitoring: start it with --slots", "not_supported_error")
    engine = state.require_ready()
    return [dataclasses.asdict(s) for s in engine.slots()]
