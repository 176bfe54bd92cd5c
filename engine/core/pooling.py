"""Embeddings: which final hidden states of a prompt a sequence keeps, and how they are
pooled (llama-server's ``--pooling``). The engine computes the prompt as it computes any
prefill (in chunks, beside decoding sequences) and hands each chunk's wanted rows here;
the sequence ends when its prompt is computed, with ``result``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

Pooling = Literal["none", "mean", "cls", "last", "rank"]
POOLINGS: tuple[str, ...] = ("none", "mean", "cls", "last", "rank")


class Pooler:
    """Pools the final hidden states of a prompt of ``n_prompt`` tokens: ``mean`` (of
    every token), ``cls`` (the first), ``last`` (the last, what a causal model has read
    the whole prompt at), ``none`` (every token's own, in order) or ``rank`` (the last
    token's state scored by ``head``: a decoder reranker's, engine/loading/rank_head.py)."""

    def __init__(self, pooling: Pooling, n_prompt: int, head: Callable[[torch.Tensor], float] | None = None):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if pooling == "rank" and head is None:
            raise ValueError("pooling rank needs a reranker (this model has no rank head)")
        self.pooling, self.n_prompt, self.head = pooling, n_prompt, head
        self._sum: torch.Tensor | None = None  # [hidden] float32 (mean)
        self._rows: list[torch.Tensor] = []  # kept rows, [k, hidden] float32 each

    @property
    def needs_whole_prompt(self) -> bool:
        """Whether every prompt position must be computed here (a reused prefix holds
        no hidden states); only ``last`` and ``rank`` can start from a cached prefix."""
        return self.pooling not in ("last", "rank")

    def rows(self, start: int, n: int) -> range:
        """Rows (0-based, within a chunk of ``n`` tokens at positions ``start``..) whose
        hidden states this pooling needs."""
        if self.pooling in ("mean", "none"):
            return range(n)
        if self.pooling == "cls":
            return range(1) if start == 0 else range(0)
        return range(n - 1, n) if start + n == self.n_prompt else range(0)

    def add(self, hidden: torch.Tensor) -> None:
        """The chunk's wanted rows' hidden states [k, hidden], in ``rows`` order."""
        hidden = hidden.float()
        if self.pooling == "mean":
            part = hidden.sum(0)  # [hidden]
            self._sum = part if self._sum is None else self._sum + part
        elif len(hidden):
            self._rows.append(hidden.clone())

    def result(self) -> list[list[float]]:
        """The pooled vector as a list of one (``none``: one per prompt token), unnormalized;
        ``rank``: [[the head's score]]."""
        if self.pooling == "rank":
            return [[float(self.head(self._rows[-1][-1]))]]
        if self.pooling == "mean":
            return [(self._sum / self.n_prompt).tolist()]
        return torch.cat(self._rows).tolist()
