"""Speculative decoding by n-gram lookup (llama-server's ``--spec-type ngram-simple``,
vLLM's prompt lookup): a decoding sequence whose last ``n`` tokens appeared earlier in
its prompt or output proposes the tokens that followed them; one forward verifies the
proposal with the sequence's next token (one logits row per position), the longest
prefix the target model itself picks is kept, and memory drops the rest (``seq_rm``).

Exact by construction where it runs: greedy sequences (any penalties and biases: each
row is sampled with the output as it would be had the proposal been accepted so far),
without a grammar, on memories that cut anywhere (attention caches; recurrent states
and sliding-window rings would need a checkpoint per proposal: not speculated).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import Sequence


def ngram_draft(tokens: list[int], n: int, n_max: int) -> list[int]:
    """Up to ``n_max`` tokens that followed the latest earlier occurrence of the last
    ``n`` tokens of ``tokens`` ([] when they occur nowhere earlier)."""
    if n_max <= 0 or len(tokens) <= n:
        return []
    key = tokens[-n:]
    for i in range(len(tokens) - n - 1, -1, -1):
        if tokens[i] == key[0] and tokens[i : i + n] == key:
            return tokens[i + n : i + n + n_max]
    return []


@dataclass(frozen=True)
class Speculation:
    """``n_max``: most tokens proposed for a sequence a step (0: off); ``n``: the
    n-gram's length; ``step_tokens``: most decode tokens a step carries, proposals
    included. On a CPU a decode step reads every weight once whatever its rows, so a
    few more rows are nearly free while the batch is small; once it is large each row
    costs compute, and a busy server proposes less, then nothing (decoding sequences
    first, proposals in the room left)."""

    n_max: int = 0
    n: int = 12
    step_tokens: int = 16
    max_decoding: int = 4  # more decoding sequences than this: no proposals (measured: see docs/benchmarks.md)

    def propose(self, running: list[Sequence], n_ctx_seq: int, cuts_anywhere: bool) -> None:
        """Set ``draft`` for each decoding sequence that may speculate (others: [])."""
        if not self.n_max:  # off: no sequence ever holds a proposal
            return
        decoding = [seq for seq in running if seq.n_pending == 1]
        spare = self.step_tokens - len(decoding)
        for seq in running:
            seq.draft = []
        if not cuts_anywhere or len(decoding) > self.max_decoding:
            return
        for seq in decoding:
            if spare <= 0:
                return
            if not seq.params.greedy or seq.matcher is not None:
                continue
            p = seq.params
            n_max = self.n_max if p.spec_n_max is None else min(self.n_max, p.spec_n_max)
            room = min(p.max_tokens - len(seq.output_ids) - 1, n_ctx_seq - len(seq.tokens) - 1)
            draft = ngram_draft(seq.tokens, self.n, min(n_max, room, spare))
            seq.draft = draft if len(draft) >= max(p.spec_n_min, 1) else []
            spare -= len(seq.draft)
