"""How many inputs one retrieval request may hold (``--max-inputs``): an embeddings
request's inputs, a rerank request's documents. Each costs a tokenization, a slot or an
encoder row, and its share of an answer built in memory, so without a cap a 1 MB body
of 200,000 one-letter documents costs seconds and hundreds of MB. Over the cap is a 400
naming it, as OpenAI answers an embeddings list over its 2,048; the OpenAPI document
states it (``maxItems``, server/schemas/openapi.py)."""

from __future__ import annotations

from server.errors import APIError


def capped(state, n: int, what: str) -> None:
    """Raises APIError 400 when ``n`` ``what`` are more than the server takes."""
    most = state.settings.max_inputs
    if n > most:
        raise APIError(400, f"the request holds {n} {what}; this server takes at most {most} (--max-inputs)")
