"""Context shift (llama-server's ``--context-shift``): a sequence whose tokens fill the
slot's context drops half of the tokens after ``n_keep`` and moves the rest down. A
mixin of ``Engine``, which owns the state it reads (config, memory, running set)."""

from __future__ import annotations

from engine.core.sequence import Sequence, StepEvent
from memory import CacheFull


class ContextShift:
    """What ``Engine`` provides: ``config``, ``memory``, ``running``, ``n_ctx_seq`` and
    ``_fault(seq, exc)``."""

    def _n_discard(self, seq: Sequence) -> int:
        """Tokens a context shift of ``seq`` would drop; 0 when shifting is off or impossible
        (a sequence with images never shifts: a cut could halve an image, and its
        positions would move under it; it ends at its context as without a shift)."""
        if not self.config.context_shift or not self.memory.can_shift or seq.media:
            return 0
        n_keep = min(seq.n_keep, seq.n_computed - 2)
        return (seq.n_computed - n_keep) // 2 if n_keep >= 0 else 0

    def _shift_full_contexts(self) -> list[StepEvent]:
        """Before the forward: every sequence whose tokens fill the slot's context drops
        half of the tokens after ``n_keep`` and moves the rest down (llama-server's
        context shift). Each shift is atomic: ``seq_rm`` of the middle is the only call
        that may need blocks (it raises CacheFull with nothing changed), and ``seq_add``
        then moves cells that the removal just rewrote into private blocks."""
        faults = []
        for seq in list(self.running):
            if len(seq.tokens) < self.n_ctx_seq:
                continue
            try:
                self._shift(seq)
            except CacheFull:
                raise
            except Exception as exc:  # this sequence's cache is not to be trusted: it ends
                faults.append(self._fault(seq, exc))
        return faults

    def _shift(self, seq: Sequence) -> None:
        n_discard = self._n_discard(seq)
        n_keep = min(seq.n_keep, seq.n_computed - 2)
        self.memory.seq_rm(seq.seq_id, n_keep, n_keep + n_discard)
        self.memory.seq_add(seq.seq_id, n_keep + n_discard, None, -n_discard)
        del seq.tokens[n_keep : n_keep + n_discard]
        seq.n_computed -= n_discard
        seq.n_shifted += n_discard
