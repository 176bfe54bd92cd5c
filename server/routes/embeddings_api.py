"""Embeddings (``--embeddings``): OpenAI's ``POST /v1/embeddings`` and llama-server's
``/embedding`` and ``/embeddings``. Each input is one engine request that computes its
prompt like any prefill (in chunks, beside decoding sequences: generation is not held
up) and ends with the prompt's final hidden states pooled (engine/core/pooling.py).
Inputs are admitted as slots free up (server/pipeline/run_batch.py): a batch of any
size is served, and one that fails cancels the rest of itself.

Pooling: ``--pooling``, else what the checkpoint names, else ``last`` (decoder models).
OpenAI's route normalizes (``embd_normalize``, llama-server's; its default is the
server's ``--embd-normalize``, 2 Euclidean unless set: -1 none, 0 max-abs to int16
range, 1 taxicab, p > 2 p-norm) and refuses pooling ``none``; the native routes
answer every token's vector for ``none``, unnormalized.
``dimensions`` other than the model's size cuts a Matryoshka model's vectors to their
leading values before normalizing (vLLM's rule: config.json's ``is_matryoshka`` or
``matryoshka_dimensions``); other models refuse it."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from typing import Annotated, Literal

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field

from engine import EncoderService, Request, SamplingParams
from server.errors import APIError
from server.pipeline.encoder_call import encoder_call
from server.pipeline.generation import prompt_ids
from server.pipeline.input_cap import capped
from server.pipeline.media import ImageBudget, media_prompt
from server.pipeline.run_batch import run_batch
from server.schemas.answers import EmbeddingList, NativeEmbedding, documented
from server.schemas.requests import MEDIA_MARKER, EmbedSize, ImagePart, Int, PromptObject, TokenId, _Body

router = APIRouter()


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ContentObject(_Body):
    """llama-server's OpenAI-style content entry: text and image parts, in order."""

    content: Annotated[list[TextPart | ImagePart], Field(min_length=1)]


Mixed = Annotated[list[TokenId | str], Field(min_length=1)]
Entry = str | Mixed | PromptObject | ContentObject
# a list: one input of ids (text pieces mixed in), or inputs, at most --max-inputs (x-limit)
Listed = Annotated[
    list[TokenId | str | Mixed | PromptObject | ContentObject],
    Field(min_length=1, json_schema_extra={"x-limit": "inputs_or_ids"}),
]
Inputs = str | PromptObject | ContentObject | Listed


_GIVEN = {k: {"required": [k], "properties": {k: {"not": {"type": "null"}}}} for k in ("input", "content")}
_BOTH = {"required": ["input", "content"], "properties": {k: {"not": {"type": "null"}} for k in ("input", "content")}}


class EmbeddingRequest(_Body):
    """``input`` (or llama-server's ``content``, not both): text, token ids (text pieces
    may be mixed in), a prompt object, or a list of them (each one input; a bare id in
    such a list is a one-token input)."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [_GIVEN["input"], _GIVEN["content"]], "not": _BOTH})
    input: Inputs = None  # one of the two is required (not null)
    content: Inputs = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    truncate: bool = False  # an encoder's input over its limit: cut (TEI's field), else 400
    embd_normalize: Int(ge=-1, le=64) | None = None  # None: the server's --embd-normalize (2)
    dimensions: EmbedSize | None = None  # OpenAI's: the model's own size, or a Matryoshka model's cut
    user: str | None = None

    def entries(self) -> list[Entry]:
        given = self.input if self.input is not None else self.content
        if given is None:
            raise APIError(400, '"input" or "content" must be provided')
        if self.input is not None and self.content is not None:
            raise APIError(400, '"input" and "content" are the same field: send one')
        if not isinstance(given, list):
            return [given]
        if all(isinstance(x, int | str) for x in given) and any(isinstance(x, int) for x in given):
            return [given]  # ids, perhaps with text pieces: one input
        return [[x] if isinstance(x, int) else x for x in given]


def normalize(vec: list[float], norm: int) -> list[float]:
    """llama.cpp's ``common_embd_normalize``."""
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = max((abs(x) for x in vec), default=0.0) / 32760.0
    elif norm == 2:
        total = math.sqrt(sum(x * x for x in vec))
    else:
        total = sum(abs(x) ** norm for x in vec) ** (1.0 / norm)
    scale = 1.0 / total if total > 0 else 0.0
    return [x * scale for x in vec]


async def _ids(state, engine, entry: Entry, budget: ImageBudget, where: str = "input") -> tuple[list[int], list]:
    """An input's token ids and its images (engine MediaItems): a prompt object's
    ``multimodal_data`` at its markers, a content entry's image parts where they stand
    (a model without an image encoder: 400, as on every route)."""
    urls: list[str | None] = []
    if isinstance(entry, PromptObject):
        urls = ["data:image;base64," + data for data in entry.multimodal_data or []]
        entry = entry.prompt_string
    elif isinstance(entry, ContentObject):
        urls = [p.image_url.url if p.image_url else None for p in entry.content if isinstance(p, ImagePart)]
        entry = "".join(p.text if isinstance(p, TextPart) else MEDIA_MARKER for p in entry.content)
    if urls:
        ids, media = await media_prompt(engine, entry, urls, where, state.settings, budget)
    else:
        ids, media = await prompt_ids(engine, entry), []
    if not ids:
        raise APIError(400, "Input content cannot be empty")
    return ids, media


def _dimensions(engine, wanted: int | None) -> int | None:
    """The length to cut vectors to (None: the whole), or a 400: ``dimensions`` other
    than the model's own size needs a Matryoshka model and one of its lengths."""
    hidden = engine.hidden_size
    if wanted is None or wanted == hidden:
        return None
    allowed = engine.matryoshka_dimensions
    if allowed is None:
        why = f"dimensions: this model's embeddings have {hidden} values and it is not a Matryoshka model"
        raise APIError(400, why + " (config.json: is_matryoshka, matryoshka_dimensions)")
    if wanted not in allowed:
        shown = "any up to " + str(hidden) if len(allowed) == hidden else ", ".join(map(str, allowed))
        raise APIError(400, f"dimensions: {wanted} is not one this model's embeddings take ({shown})")
    return wanted


async def _embed(http: HTTPRequest, body: EmbeddingRequest, oai: bool) -> tuple[list[list[list[float]]], int]:
    """Each input's vectors (pooled: one), and how many tokens were read. Every input
    is checked before any runs: a bad one refuses the whole request."""
    state = http.app.state.slotserve
    if not state.serves_embeddings:
        why = "This server does not support embeddings. Start it with `--embeddings`"
        raise APIError(501, why, "not_supported_error")
    engine = state.require_model()
    pooling = state.embedding_pooling
    if oai and pooling == "none":
        raise APIError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    if pooling == "rank":
        raise APIError(400, "this server ranks (pooling rank): send query and documents to /v1/rerank")
    size, entries = _dimensions(engine, body.dimensions), body.entries()
    capped(state, len(entries), "inputs")
    if isinstance(engine, EncoderService):
        inputs = await _encoder_inputs(engine, entries, body.truncate)
        vectors = await encoder_call(state, http, engine.embed(inputs, pooling))
        if vectors is None:
            return [], -1  # the client left
        return await asyncio.to_thread(_finished, state, body, vectors, size, pooling), sum(map(len, inputs))
    budget = ImageBudget()  # one budget for the images of all the inputs
    prompts = [await _ids(state, engine, e, budget, _where(k, entries)) for k, e in enumerate(entries)]
    reqs = [Request(ids, SamplingParams(max_tokens=1), pooling=pooling, media=media) for ids, media in prompts]
    for req in reqs:
        engine.validate(req)
    batch = run_batch(state, http, reqs, engine.n_slots)  # admitted as slots free up
    try:
        if not await batch.open_first() or not await batch.collect():
            return [], -1  # the client left
    finally:
        await batch.close()
    vectors = [run.choices[0].embedding for run in batch.runs]
    return await asyncio.to_thread(_finished, state, body, vectors, size, pooling), sum(len(i) for i, _ in prompts)


def _where(k: int, entries: list) -> str:
    return f"input[{k}]" if len(entries) > 1 else "input"


def _finished(state, body: EmbeddingRequest, vectors: list, size: int | None, pooling: str) -> list:
    """Vectors cut to ``size`` (a Matryoshka model's leading values), then normalized
    (pooled ones only)."""
    if size is not None:
        vectors = [[row[:size] for row in v] for v in vectors]
    if pooling != "none":
        norm = state.settings.embd_normalize if body.embd_normalize is None else body.embd_normalize
        vectors = [[normalize(v[0], norm)] for v in vectors]
    return vectors


async def _encoder_inputs(encoder: EncoderService, entries: list[Entry], truncate: bool) -> list[list[int]]:
    """An encoder's inputs as token ids: texts with the model's special tokens (all in
    one worker-thread call), ids as given; over its limit, cut (``truncate``) or
    refused (400)."""
    texts: dict[int, str] = {}
    ids: list[list[int]] = [[] for _ in entries]
    for k, entry in enumerate(entries):
        if (
            isinstance(entry, PromptObject)
            and entry.multimodal_data
            or (isinstance(entry, ContentObject) and any(isinstance(p, ImagePart) for p in entry.content))
        ):
            raise APIError(400, f"{_where(k, entries)}: this model takes no images")
        if isinstance(entry, PromptObject):
            texts[k] = entry.prompt_string
        elif isinstance(entry, ContentObject):
            texts[k] = "".join(p.text for p in entry.content if isinstance(p, TextPart))
        elif isinstance(entry, str):
            texts[k] = entry
        else:
            ids[k] = await prompt_ids(encoder, entry)  # ids, perhaps with text pieces
    for k, encoded in zip(texts, await encoder.encode(list(texts.values()))):
        ids[k] = encoded
    for k in range(len(entries)):
        if truncate:
            ids[k] = encoder.cut(ids[k])
        encoder.check(ids[k], _where(k, entries))
    return ids


def _encoded(vec: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


@router.post(
    "/v1/embeddings",
    response_model=None,
    responses=documented(EmbeddingList | list[NativeEmbedding], 400, 413, 501, 503),
)
async def embeddings_oai(body: EmbeddingRequest, http: HTTPRequest) -> Response:
    """OpenAI's embeddings (normalized). With llama-server's ``content`` instead of
    ``input``, the answer is the native one, as llama-server answers it."""
    if body.input is None:
        return await embeddings_native(body, http)
    vectors, n_tokens = await _embed(http, body, oai=True)
    if n_tokens < 0:
        return Response(status_code=499)
    model = body.model or http.app.state.slotserve.settings.model_name

    def answer() -> JSONResponse:  # thousands of vectors to JSON: off the event loop
        data = []
        for i, vecs in enumerate(vectors):
            item = {"embedding": vecs[0], "index": i, "object": "embedding"}
            if body.encoding_format == "base64":
                item |= {"embedding": _encoded(vecs[0]), "encoding_format": "base64"}
            data.append(item)
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return JSONResponse({"model": model, "object": "list", "usage": usage, "data": data})

    return await asyncio.to_thread(answer)


@router.post("/embedding", response_model=None, responses=documented(list[NativeEmbedding], 400, 413, 501, 503))
@router.post("/embeddings", include_in_schema=False)
async def embeddings_native(body: EmbeddingRequest, http: HTTPRequest) -> Response:
    """llama-server's embeddings: per input, ``embedding`` is a list of vectors (one
    pooled vector; pooling ``none``: one per token, unnormalized)."""
    vectors, n_tokens = await _embed(http, body, oai=False)
    if n_tokens < 0:
        return Response(status_code=499)
    return await asyncio.to_thread(lambda: JSONResponse([{"index": i, "embedding": v} for i, v in enumerate(vectors)]))
