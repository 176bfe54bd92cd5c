"""Reranking on a decoder reranker (Qwen3-Reranker, engine/loading/rank_head.py): each
(query, document) pair is the model's prompt, tokenized as it stands (its special tokens
parsed, none added: llama-server's rerank prompt), and one engine request that pools
``rank``. The pairs share the prompt's head (system text and query), which prefix reuse
computes once per slot. Pairs are admitted as slots free up (server/pipeline/run_batch.py)."""

from __future__ import annotations

import asyncio

from fastapi import Request as HTTPRequest

from engine import EngineService, Ranked, Request, SamplingParams, probability
from server.pipeline.run_batch import run_batch
from server.state import ServerState


async def decoder_rerank(
    state: ServerState,
    http: HTTPRequest,
    engine: EngineService,
    query: str,
    documents: list[str],
    raw: bool,
    truncate: bool = False,
) -> list[Ranked] | None:
    """Each document's score in the request's order (the log-odds of "yes" with ``raw``,
    else its sigmoid); None when the client left. ``truncate``: a pair longer than a
    slot's context has its document cut to fit (the encoders' rule cuts the longer side;
    here the query and the instruction around it stay whole); else it is refused.
    Raises APIError as admission does."""
    tok, limit = engine.tokenizer, engine.n_ctx - 1  # a prompt must leave the slot a position

    def prompt(document: str) -> list[int]:
        return tok.encode(engine.rerank_prompt(query, document), add_special=False)

    def fitted(document: str) -> list[int]:
        ids = prompt(document)
        if not truncate or len(ids) <= limit:
            return ids
        words, over = tok.encode(document, add_special=False), len(ids) - limit
        while len(ids) > limit and over <= len(words):  # tokens may merge anew at the cut: cut again
            ids = prompt(tok.decode(words[: len(words) - over]))
            over += max(1, len(ids) - limit)
        return ids

    def prompts() -> list[list[int]]:
        return [fitted(d) for d in documents]

    ids = await asyncio.to_thread(prompts)
    reqs = [Request(p, SamplingParams(max_tokens=1), pooling="rank") for p in ids]
    for req in reqs:
        engine.validate(req)
    batch = run_batch(state, http, reqs, engine.n_slots)
    try:
        if not await batch.open_first() or not await batch.collect():
            return None
    finally:
        await batch.close()
    logits = [run.choices[0].embedding[0][0] for run in batch.runs]
    scores = logits if raw else [probability(x) for x in logits]
    return [Ranked(i, s, len(p)) for i, (s, p) in enumerate(zip(scores, ids))]
