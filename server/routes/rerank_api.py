"""Reranking (``--rerank``, or a cross-encoder model): llama-server's ``/reranking`` and
its aliases ``/rerank``, ``/v1/rerank``, ``/v1/reranking``, with Jina's and Cohere's
fields and Hugging Face TEI's.

Each (query, document) pair is one input of the encoder's queue (engine/encoder_service.py):
its classification head's first logit, through a sigmoid (``relevance_score`` in 0..1,
as vLLM, TEI, Jina and Cohere answer; sentence-transformers' CrossEncoder the same)
unless ``raw_scores`` (llama-server answers the logit). On a decoder reranker
(Qwen3-Reranker) each pair is an engine request on the model's prompt
(server/pipeline/decoder_rank.py), scored by the log-odds of "yes" over "no"; the
sigmoid of that is the probability llama-server answers. Results are sorted best first
and cut to ``top_n``; ``return_documents`` adds each document's text (Jina, Cohere).
With TEI's ``texts`` instead of ``documents``, the answer is TEI's: a bare list of
``{index, score}`` (``text`` with ``return_text``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field

from engine import EncoderService
from server.errors import APIError
from server.pipeline.decoder_rank import decoder_rerank
from server.pipeline.encoder_call import encoder_call
from server.pipeline.input_cap import capped
from server.schemas.answers import RerankList, TEIRank, documented
from server.schemas.requests import Int, _Body

router = APIRouter()


class DocumentObject(_Body):
    """Jina's and Cohere's document object."""

    text: str


Documents = Annotated[list[str | DocumentObject], Field(min_length=1, json_schema_extra={"x-limit": "inputs"})]


_GIVEN = {k: {"required": [k], "properties": {k: {"not": {"type": "null"}}}} for k in ("documents", "texts")}
_BOTH = {"required": ["documents", "texts"], "properties": {k: _GIVEN[k]["properties"][k] for k in _GIVEN}}


class RerankRequest(_Body):
    model_config = ConfigDict(json_schema_extra={"anyOf": [_GIVEN["documents"], _GIVEN["texts"]], "not": _BOTH})
    query: str
    documents: Documents | None = None
    texts: Documents | None = None  # TEI's name: the answer is TEI's list
    top_n: Int(ge=0) | None = None  # None: every document
    return_documents: bool = False
    return_text: bool = False  # TEI's
    raw_scores: bool = False  # the head's logit, as llama-server answers
    truncate: bool = False  # a pair over the model's limit: cut (the longer side first), else 400
    model: str | None = None

    def texts_of(self) -> list[str]:
        given = self.documents if self.documents is not None else self.texts
        if given is None:
            raise APIError(400, '"documents" must be a non-empty string array')
        if self.documents is not None and self.texts is not None:
            raise APIError(400, '"documents" and "texts" (TEI\'s name) are the same field: send one')
        return [d.text if isinstance(d, DocumentObject) else d for d in given]


@router.post("/v1/rerank", response_model=None, responses=documented(RerankList | list[TEIRank], 400, 413, 501, 503))
@router.post("/rerank", include_in_schema=False)
@router.post("/reranking", include_in_schema=False)
@router.post("/v1/reranking", include_in_schema=False)
async def rerank(body: RerankRequest, http: HTTPRequest) -> Response:
    """Each document's relevance to the query, best first."""
    state = http.app.state.slotserve
    model = state.require_model() if state.serves_embeddings else None
    if model is None or state.embedding_pooling != "rank":
        why = "This server does not support reranking. Start it with `--rerank` and a reranker model"
        raise APIError(501, why, "not_supported_error")
    documents = body.texts_of()
    capped(state, len(documents), "documents")
    if isinstance(model, EncoderService):
        work = model.rerank(body.query, documents, body.truncate, body.raw_scores)
        ranked = await encoder_call(state, http, work)
    else:
        ranked = await decoder_rerank(state, http, model, body.query, documents, body.raw_scores, body.truncate)
    if ranked is None:
        return Response(status_code=499)
    return await asyncio.to_thread(_answer, body, state, documents, ranked)  # thousands of them: off the loop


def _answer(body: RerankRequest, state, documents: list[str], ranked: list) -> JSONResponse:
    n_tokens = sum(r.n_tokens for r in ranked)
    ranked = sorted(ranked, key=lambda r: -r.score)[: body.top_n]
    if body.documents is None:  # TEI
        tei = [{"index": r.index, "score": r.score} for r in ranked]
        if body.return_text:
            tei = [item | {"text": documents[item["index"]]} for item in tei]
        return JSONResponse(tei)
    results = [{"index": r.index, "relevance_score": r.score} for r in ranked]
    if body.return_documents:
        results = [item | {"document": {"text": documents[item["index"]]}} for item in results]
    return JSONResponse(
        {
            "model": body.model or state.settings.model_name,
            "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results,
        }
    )
