"""Speculative decoding: a decoding sequence proposes the tokens it expects next, by
n-gram lookup (llama-server's ``--spec-type ngram-simple``, vLLM's prompt lookup: the
tokens that followed the latest earlier occurrence of its last ``n`` tokens) or from a
draft model (``-md``, engine/core/draft_model.py); one forward verifies the proposal
with the sequence's next token (one logits row per position), the longest prefix the
target model itself picks is kept, and memory drops the rest (``seq_rm``).

Exact for every sampler: row j is sampled exactly as the plain step would sample the
sequence's next token had the proposal's first j tokens been output (same penalties,
same grammar state, same seeded draw, whose counter is the output length), and a
proposed token counts only where that draw picked it. A proposal is one token, not a
distribution, so this is rejection sampling with a point proposal: accepted with the
target's probability of it, otherwise the target's own draw stands (a sample from the
target without the proposed token, renormalized). Seeded output is the same token for
token with and without speculation.

Memories that cannot drop a token anywhere (recurrent states, sliding-window rings)
hold a checkpoint before each proposal is verified (``Memory.hold``): a rejection puts
the memory back to it, and the next step computes the confirmed tokens again (one
forward over them and the token after); output stays identical to plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.sequence import Sequence
from engine.sampling.params import SamplingParams

if TYPE_CHECKING:
    from engine.core.draft_model import DraftModel


def ngram_draft(tokens: list[int], n: int, n_max: int) -> list[int]:
    """Up to ``n_max`` tokens that followed the latest earlier occurrence of the last
    ``n`` tokens of ``tokens`` ([] when they occur nowhere earlier). Where that
    continuation runs into the end of ``tokens``, the text repeats with its length as
    period, and it goes on repeating: what looking up again after each proposed token
    would propose (a model stuck in a loop is proposed the whole loop, not one turn)."""
    if n_max <= 0 or len(tokens) <= n:
        return []
    key = tokens[-n:]
    for i in range(len(tokens) - n - 1, -1, -1):
        if tokens[i] == key[0] and tokens[i : i + n] == key:
            draft = tokens[i + n : i + n + n_max]
            if len(draft) < n_max and i + n + len(draft) == len(tokens):
                draft = [draft[k % len(draft)] for k in range(n_max)]
            return draft
    return []


@dataclass
class Speculation:
    """``n_max``: most tokens proposed for a sequence a step (0: off); ``n``: the
    n-gram's length; ``draft``: the draft model, when proposals come from one (then
    ``p_min``: its guesses below this probability end a proposal); ``step_tokens``:
    most decode tokens a step carries, proposals included. On a CPU a decode step reads
    every weight once whatever its rows, so a few more rows are nearly free while the
    batch is small; once it is large each row costs compute, and a busy server
    proposes less, then nothing (decoding sequences first, proposals in the room
    left). Per sequence, a proposal is at most its ``draft_window``: doubled after a
    proposal accepted whole (up to ``n_max``), cut to one more than was accepted
    otherwise."""

    n_max: int = 0
    n: int = 12
    draft: DraftModel | None = None
    p_min: float = 0.0
    n_min: int = 0  # shorter proposals are not verified
    step_tokens: int = 16
    max_decoding: int = 4  # more decoding sequences than this: no proposals (measured: see docs/benchmarks.md)

    def propose(self, running: list[Sequence], n_ctx_seq: int) -> None:
        """Set ``draft`` for each decoding sequence that may speculate (others: [])."""
        if not self.n_max:  # off: no sequence ever holds a proposal
            return
        decoding = [  # mirostat's and a reasoning budget's states move token by token: not verified together
            seq
            for seq in running
            if seq.n_pending == 1 and seq.pooler is None and not seq.params.mirostat and seq.budget is None
        ]
        spare = self.step_tokens - len(decoding)
        for seq in running:
            seq.draft = []
        if len(decoding) > self.max_decoding:
            return
        wants = []
        for seq in decoding:
            p = seq.params
            n_max = self.n_max if p.spec_n_max is None else min(self.n_max, p.spec_n_max)
            room = min(p.max_tokens - len(seq.output_ids) - 1, n_ctx_seq - len(seq.tokens) - 1)
            n = min(n_max, room, spare, seq.draft_window or n_max)
            if n > 0 and n >= self._n_min(p):
                wants.append((seq, n, self.p_min if p.spec_p_min is None else p.spec_p_min))
                spare -= n
        if self.draft is not None:
            drafts = self.draft.propose(wants)
        else:
            drafts = [ngram_draft(seq.tokens, self.n, n) for seq, n, _ in wants]
        for (seq, _, _), draft in zip(wants, drafts):
            if seq.matcher is not None and draft:  # the grammar cuts the proposal at its first forbidden token
                draft = draft[: seq.matcher.validate_tokens(draft)]
            seq.draft = draft if len(draft) >= max(self._n_min(seq.params), 1) else []

    def _n_min(self, p: SamplingParams) -> int:
        return self.n_min if p.spec_n_min is None else p.spec_n_min

    def settled(self, seq: Sequence, n_confirmed: int) -> None:
        """After the target's verdict on ``seq.draft``: counts and the next window."""
        n = len(seq.draft)
        seq.n_drafts += 1
        seq.n_drafted += n
        seq.n_draft_accepted += n_confirmed
        window = seq.draft_window or self.n_max
        seq.draft_window = min(self.n_max, max(window, 2 * n)) if n_confirmed == n else n_confirmed + 1
