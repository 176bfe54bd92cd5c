"""An encoder model as the HTTP side sees it (issue 54): embeddings and reranking from
BERT-family encoders and cross-encoders (engine/core/encoder.py), beside, not through,
the generation engine: no slots, no cache. Requests are jobs on the encoder's own
queue and thread (engine/scheduling/encoder_queue.py).

Thread contract: the constructor loads the model (the server runs it in its loader
thread), ``start`` starts the encoder thread; everything else is called from the event
loop, and what tokenizes or computes runs in a worker thread or the encoder thread."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.encoder import EncoderEngine
from engine.errors import CheckpointError, RequestError
from engine.scheduling.encoder_queue import EncoderQueue
from engine.scheduling.health import Health
from engine.text.tokenizer import TokenizeError, Tokenizer


@dataclass(frozen=True)
class Ranked:
    index: int  # the document's place in the request
    score: float  # the head's first logit, or its sigmoid
    n_tokens: int  # the pair's tokens


def probability(log_odds: float) -> float:
    """A reranker's logit as a relevance score in 0..1 (the sigmoid)."""
    return 1.0 / (1.0 + math.exp(-log_odds)) if log_odds > -700 else 0.0


class EncoderService:
    takes_images = False

    def __init__(self, model: Path, pooling: str | None = None, n_threads: int = 0, round_tokens: int = 2048):
        """``pooling``: the server's ``--pooling`` (None: the checkpoint's). Vectors come
        back unnormalized: the routes normalize (``embd_normalize``)."""
        torch.set_flush_denormal(True)
        if n_threads:
            torch.set_num_threads(n_threads)
        self._encoder = EncoderEngine.from_pretrained(model, pooling=pooling, normalize=False)
        if self._encoder.config.pooling == "rank" and self._encoder.config.n_labels == 0:
            raise CheckpointError(f"{model}: pooling rank needs a classification head (a cross-encoder reranker)")
        self._round_tokens = round_tokens
        self._queue: EncoderQueue | None = None
        bos, eos = self._encoder.special_names
        self.tokenizer = Tokenizer(self._encoder.full_tokenizer, bos_token=bos, eos_token=eos)
        self._encoder.embed([self.tokenizer.encode("warm up")])

    def start(self, max_queue: int = 256, stall_timeout: float = 60.0) -> None:
        self._queue = EncoderQueue(self._encoder.embed, self._round_tokens, max_queue, stall_timeout)
        self._queue.start()

    def stop(self, timeout: float | None = 30.0) -> bool:
        return self._queue is None or self._queue.stop(timeout)

    # ---- facts -----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def n_ctx(self) -> int:
        """Most tokens one input may have, special tokens included."""
        return self._encoder.config.max_tokens

    @property
    def hidden_size(self) -> int:
        return self._encoder.config.hidden_size

    @property
    def embedding_pooling(self) -> str:
        """``--pooling``, else the checkpoint's (a cross-encoder's: rank)."""
        return self._encoder.config.pooling

    @property
    def reranks(self) -> bool:
        """Whether the model has a classification head (it ranks query-document pairs)."""
        return self._encoder.config.n_labels > 0

    @property
    def matryoshka_dimensions(self) -> Sequence[int] | None:
        """The leading lengths an embedding may be cut to (config.json's Matryoshka fields)."""
        return self._encoder.config.matryoshka

    @property
    def architecture(self) -> str:
        return self._encoder.config.architecture

    @property
    def weight_bytes(self) -> dict[str, int]:
        """Resident weight bytes by type (encoders run in float32)."""
        return {"F32": sum(p.numel() * p.element_size() for p in self._encoder.model.parameters())}

    def health(self) -> Health:
        if self._queue is None:
            raise RuntimeError("the encoder thread was not started")
        return self._queue.health()

    def counts(self) -> tuple[int, int]:
        """Inputs and tokens encoded since start (a racy read, for /metrics)."""
        return (self._queue.n_inputs, self._queue.n_tokens) if self._queue else (0, 0)

    # ---- requests --------------------------------------------------------------

    async def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens in, nothing cut (in a worker thread).
        Raises TokenizeError for text the tokenizer cannot take."""
        if not texts:
            return []
        try:
            encoded = await asyncio.to_thread(self._encoder.full_tokenizer.encode_batch, texts)
        except (TypeError, ValueError) as exc:
            raise TokenizeError(f"the text cannot be tokenized: {exc}") from exc
        return [e.ids for e in encoded]

    def check(self, ids: list[int], where: str = "input") -> None:
        """RequestError for an input this model cannot take (empty, or over ``n_ctx``)."""
        if not ids:
            raise RequestError(f"{where} has no tokens")
        if len(ids) > self.n_ctx:
            why = f"{where} has {len(ids)} tokens, more than this model takes ({self.n_ctx})"
            raise RequestError(why + ': shorten it, or send "truncate": true', code="context_length_exceeded")

    def cut(self, ids: list[int]) -> list[int]:
        """``ids`` cut to ``n_ctx`` tokens by the encoders' one rule (``EncoderEngine.cut``)."""
        return self._encoder.cut(ids)

    async def embed(self, inputs: list[list[int]], pooling: str | None = None) -> list[list[list[float]]]:
        """Each input's vectors: one pooled vector, or one per token for ``none`` (checked
        inputs: see ``check``). Raises QueueFull, EngineStopped, StepFailed."""
        pooling = pooling or self.embedding_pooling
        vectors = await self._submit(inputs, pooling)
        return await asyncio.to_thread(lambda: [v.tolist() if pooling == "none" else [v.tolist()] for v in vectors])

    async def rerank(self, query: str, documents: list[str], truncate: bool, raw: bool = False) -> list[Ranked]:
        """Each document's relevance to ``query`` in the request's order: the head's first
        logit over the pair, through a sigmoid unless ``raw``. RequestError for a pair
        over ``n_ctx`` tokens unless ``truncate`` (the longer side is cut)."""
        pairs = await asyncio.to_thread(self._encoder.encode_pairs, query, documents, truncate)
        for i, (ids, _) in enumerate(pairs):
            self.check(ids, f"documents[{i}] with the query")
        logits = await self._submit([ids for ids, _ in pairs], "rank", [types for _, types in pairs])
        scores = [float(v[0]) for v in logits]
        if not raw:
            scores = [probability(s) for s in scores]
        return [Ranked(i, s, len(ids)) for i, (s, (ids, _)) in enumerate(zip(scores, pairs))]

    async def _submit(self, inputs, pooling: str, type_ids=None) -> list[torch.Tensor]:
        if self._queue is None:
            raise RuntimeError("the encoder thread was not started")
        return await self._queue.submit(inputs, pooling, type_ids)
