"""llama-server's native routes: /completion, /tokenize, /detokenize, /apply-template,
/props, /slots."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from engine import EncoderService, EngineStopped, SlotInfo, check_token_ids
from server.errors import APIError
from server.pipeline.chat_prompt import render_chat
from server.pipeline.generation import (
    LLAMA_DEFAULTS,
    decode,
    encode,
    prompt_ids,
)
from server.pipeline.media import ImageBudget, media_prompt
from server.pipeline.native_answer import generation_settings
from server.pipeline.native_completion import complete
from server.schemas.answers import (
    ApplyTemplateResult,
    DetokenizeResult,
    NativeCompletion,
    Props,
    SleepingProps,
    SlotState,
    Success,
    TokenizeResult,
    documented,
)
from server.schemas.requests import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    NativeCompletionRequest,
    PromptObject,
    TokenizeRequest,
)
from server.schemas.sampler_fields import sampler_order

router = APIRouter()


@router.post(
    "/completion",
    response_model=None,
    responses=documented(NativeCompletion | list[NativeCompletion], 400, 413, 500, 503, stream=True),
)
@router.post("/completions", include_in_schema=False)  # llama-server's native completion there too
async def completion(body: NativeCompletionRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    prompts, batch = body.prompts()
    ids, media, budget = [], [], ImageBudget()  # one budget for the images of all the prompts
    for k, p in enumerate(prompts):
        if isinstance(p, PromptObject):  # text with images at its markers
            urls = ["data:image;base64," + data for data in p.multimodal_data]
            where = f"prompt[{k}].multimodal_data" if batch else "prompt.multimodal_data"
            p_ids, p_media = await media_prompt(engine, p.prompt_string, urls, where, state.settings, budget)
        else:
            p_ids, p_media = await prompt_ids(engine, p), []
        ids.append(p_ids)
        media.append(p_media)
    return await complete(http, body, ids, batch, media)


@router.post("/tokenize", response_model=None, responses=documented(TokenizeResult, 400, 413, 503))
async def tokenize(body: TokenizeRequest, http: HTTPRequest) -> dict:
    """Text -> token ids (with pieces on request). A prompt object with images: the ids
    /completion would compute, each image's placeholder tokens in place, and ``media``:
    where each image (each frame of a tiled one) stands, and its id (the digest that
    prefix reuse compares)."""
    state = http.app.state.slotserve
    engine = state.require_model()
    media = []
    if isinstance(body.content, PromptObject) and body.content.multimodal_data:
        urls = ["data:image;base64," + data for data in body.content.multimodal_data]
        ids, media = await media_prompt(
            engine, body.content.prompt_string, urls, "content.multimodal_data", state.settings, ImageBudget()
        )
    else:
        text = body.content.prompt_string if isinstance(body.content, PromptObject) else body.content
        ids = await encode(engine, text, add_special=body.add_special)
    shown = {"media": [{"start": m.start, "n_tokens": m.n_tokens, "id": m.digest} for m in media]} if media else {}
    if not body.with_pieces:
        return {"tokens": ids, **shown}
    pieces = await asyncio.to_thread(lambda: [engine.tokenizer.decode([i], skip_special=False) for i in ids])
    return {"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces)], **shown}


@router.post("/detokenize", response_model=None, responses=documented(DetokenizeResult, 400, 413, 503))
async def detokenize(body: DetokenizeRequest, http: HTTPRequest) -> dict:
    engine = http.app.state.slotserve.require_model()
    check_token_ids(body.tokens, engine.vocab_size, "tokens")
    return {"content": await decode(engine, body.tokens, skip_special=False)}


@router.post("/apply-template", response_model=None, responses=documented(ApplyTemplateResult, 400, 413, 503))
async def apply_template(body: ApplyTemplateRequest, http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    engine = state.require_ready()
    return {"prompt": await render_chat(engine, body, state.settings.template_kwargs, state.settings.prefill_assistant)}


def _default_params(state) -> dict:
    """What a /completion request that sets nothing samples with (the server's flags over
    llama-server's defaults)."""
    params = {**LLAMA_DEFAULTS, **state.settings.sampling_defaults, "n_predict": state.settings.n_predict}
    params["samplers"] = list(
        sampler_order(params["samplers"]) if isinstance(params["samplers"], str | list) else params["samplers"]
    )
    return params


def _asleep_props(state) -> dict:
    """--sleep-idle-seconds: what is known without the model (asking does not wake it)."""
    return {
        "is_sleeping": True,
        "total_slots": state.settings.parallel,
        "model_path": str(state.settings.model),
        "model_alias": state.settings.model_name,
        "build_info": "slotserve",
    }


@router.get("/props", response_model=None, responses=documented(Props | SleepingProps, 503))
async def props(http: HTTPRequest) -> dict:
    state = http.app.state.slotserve
    if state.sleeping:
        return _asleep_props(state)
    if state.encoder is not None and state.status == "ready":
        return _encoder_props(state, state.encoder)
    engine = state.require_ready()
    try:
        memory = await engine.memory_report()
    except EngineStopped:
        if state.sleeping:  # the model went to sleep while this asked it (a probe keeps nothing awake)
            return _asleep_props(state)
        raise
    tok = engine.tokenizer
    template = tok.chat_template
    return {
        "default_generation_settings": {"n_ctx": engine.n_ctx, "params": _default_params(state)},
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
        "cors_proxy_enabled": state.settings.ui_mcp_proxy,
        "endpoint_slots": state.settings.slots,
        "endpoint_props": state.settings.props,
        "endpoint_metrics": state.settings.metrics,
        "memory": memory,
        "modalities": {"vision": engine.takes_images, "audio": False},  # llama-server's field
        "device": engine.device,
        "weights": {"bytes": sum(engine.weight_bytes.values()), "types": engine.weight_bytes},
        "prompt_cache": engine.prompt_cache() or {"enabled": False},
        "speculative": engine.speculation(),
    }


def _encoder_props(state, encoder: EncoderService) -> dict:
    """/props of an encoder model: what it embeds or ranks; no slots, no template."""
    tok = encoder.tokenizer
    return {
        "default_generation_settings": {"n_ctx": encoder.n_ctx, "params": {}},
        "total_slots": 0,
        "model_path": str(state.settings.model),
        "model_alias": state.settings.model_name,
        "chat_template": "",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "build_info": "slotserve",
        "is_sleeping": False,
        "endpoint_slots": state.settings.slots,
        "endpoint_props": state.settings.props,
        "endpoint_metrics": state.settings.metrics,
        "modalities": {"vision": False, "audio": False},
        "encoder": {
            "architecture": encoder.architecture,
            "pooling": state.embedding_pooling,
            "n_embd": encoder.hidden_size,
            "rerank": state.embedding_pooling == "rank",
        },
        "weights": {"bytes": sum(encoder.weight_bytes.values()), "types": encoder.weight_bytes},
    }


@router.post("/props", response_model=None, responses=documented(Success, 501))
async def change_props(http: HTTPRequest) -> dict:
    """llama-server's POST /props: 501 unless started with --props; then a success that
    changes nothing (llama-server updates no property either)."""
    if not http.app.state.slotserve.settings.props:
        raise APIError(501, "This server does not support changing global properties. Start it with `--props`",
                       "not_supported_error")  # fmt: skip
    return {"success": True}


@router.get("/slots", response_model=None, responses=documented(list[SlotState], 501, 503))
async def slots(http: HTTPRequest) -> list[dict]:
    state = http.app.state.slotserve
    if not state.settings.slots:
        raise APIError(501, "this server does not serve slot monitoring: start it with --slots", "not_supported_error")
    engine = state.require_ready()
    return [_slot_json(s, engine.tokenizer.eos_ids, state.settings.slots_debug) for s in engine.slots()]


def _slot_json(slot: SlotInfo, eos_ids, debug: bool) -> dict:
    """A slot as /slots shows it: the running request's sampling params only with
    --slots-debug (LLAMA_SERVER_SLOTS_DEBUG), as llama-server, in /completion's
    ``generation_settings`` form (bans as ``false``: valid JSON)."""
    out = {f.name: getattr(slot, f.name) for f in dataclasses.fields(slot) if f.name != "params"}
    if debug:
        out["params"] = generation_settings(slot.params, eos_ids) if slot.params is not None else {}
    return out
