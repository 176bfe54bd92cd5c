"""Which tokens run in the next step: decode tokens first (with their proposed tokens,
if any: ``Sequence.draft``), then prefill chunks."""

from __future__ import annotations

from typing import NamedTuple

from engine.core.media import split_point
from engine.core.sequence import Sequence


class Chunk(NamedTuple):
    seq: Sequence
    n_tokens: int
    samples: bool  # the chunk reaches the end of the known tokens: sample the next one (never for an embedding)


def _chunk(seq: Sequence, n: int) -> Chunk:
    return Chunk(seq, n, seq.pooler is None and seq.n_computed + n == len(seq.tokens))


def plan_step(running: list[Sequence], budget: int, align: int | None = None) -> list[Chunk]:
    """Every decoding sequence gets its token first (in order, up to ``budget``), then
    prefilling sequences get chunks first-come first-served until the budget is spent.
    ``align``: a prefill chunk never runs past a multiple of it (memories that snapshot
    their state there, see memory/recurrent/recurrent_memory.py), nor past the
    prompt's last token but one: the state there is snapshotted (the runner), so a
    request for the same prompt again (the answer regenerated) computes that one token,
    not back to the last multiple; nor past ``Sequence.turn_start`` (snapshotted too: the
    next chat turn, whose history writes the generation prompt its own way, starts there)."""
    plan: list[Chunk] = []
    for seq in running:
        if seq.n_pending == 1 and budget > 0:
            del seq.draft[budget - 1 :]  # a proposal (speculation.py) rides along as far as the budget goes
            plan.append(Chunk(seq, 1 + len(seq.draft), seq.pooler is None))
            budget -= 1 + len(seq.draft)
    for seq in running:
        if seq.n_pending > 1 and budget > 0:
            n = min(seq.n_pending, budget)
            if align:
                n = min(n, align - seq.n_computed % align)
                if seq.turn_start is not None and seq.n_computed < seq.turn_start < seq.n_computed + n:
                    n = seq.turn_start - seq.n_computed  # snapshotted there too (a chat turn's generation prompt)
                if n == seq.n_pending and not seq.output_ids and seq.pooler is None:
                    n -= 1  # the prompt's last token runs alone next step, after a snapshot before it
            if seq.media:  # an image's positions run in one forward, once encoded (engine/core/media.py)
                n = split_point(seq.media, seq.n_computed, n)
                if n == 0:  # its next image is still being encoded
                    continue
            plan.append(_chunk(seq, n))
            budget -= n
    return plan
