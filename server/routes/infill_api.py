"""llama-server's ``POST /infill``: fill in the middle of code between a prefix and a
suffix, with other files as context, on models that have FIM tokens (engine/text/fim.py);
answered like ``/completion`` (streamed or not)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import Response
from pydantic import Field

from engine import infill_prompt
from server.errors import APIError
from server.pipeline.native_completion import complete
from server.schemas.answers import NativeCompletion, documented
from server.schemas.requests import NativeCompletionRequest, _Body

router = APIRouter()


class InfillChunk(_Body):
    """Another file: its text (required) and name (default ``tmp``)."""

    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    """``input_prefix`` and ``input_suffix`` around the hole; ``prompt``: what is
    already written of the middle; ``input_extra``: other files, latest last."""

    prompt: str = ""  # type: ignore[assignment]
    input_prefix: str
    input_suffix: str
    input_extra: Annotated[list[InfillChunk], Field(max_length=1024)] = []


@router.post(
    "/infill",
    response_model=None,
    responses=documented(NativeCompletion | list[NativeCompletion], 400, 413, 500, 501, 503, stream=True),
)
async def infill(body: InfillRequest, http: HTTPRequest) -> Response:
    state = http.app.state.slotserve
    engine = state.require_ready()
    tok, settings = engine.tokenizer, state.settings
    missing = tok.fim.missing()
    if missing:
        message = f"Infill is not supported by this model: {'. '.join(missing)}."
        raise APIError(501, message, "not_supported_error")  # the server's ability, not the request: as llama-server
    n_predict = body.n_predict if body.n_predict >= 0 else settings.n_predict
    extra = [(chunk.filename, chunk.text) for chunk in body.input_extra]
    ids = await asyncio.to_thread(
        infill_prompt,
        lambda text: tok.encode(text, add_special=False),
        tok.bos_id if tok.add_bos else None,
        tok.fim,
        body.input_prefix,
        body.input_suffix,
        extra,
        body.prompt,
        min(settings.batch_size, engine.n_ctx // 2),  # llama-server takes -b whole: here prefix + suffix fit a slot
        n_predict,
        engine.n_ctx,
    )
    return await complete(http, body, [ids], batch=False)
