"""Two memories serving the same sequences as one ``Memory``: the base of the iSWA
pair (full-attention layers + a sliding-window ring) and the hybrid pair (attention
layers + recurrent states).

The *lead* is any memory that is all-or-nothing on its own (a KV cache, or an iSWA
pair inside a hybrid). The *follower* is the one that refuses more (it forgets: it
can cut only where it still holds or kept a checkpoint), so it is asked first, without
changing anything (``check_batch``, ``can_rm``, ``check_cp``, ``validate_state``);
then the lead acts (it may still refuse or raise, e.g. ``CacheFull``, leaving itself
unchanged); only then the follower, which can no longer fail. So every operation is
all-or-nothing across both. A cut point is one both can cut at; the positions held
are those both can serve. Neither can shift positions.

Subclasses say how the two halves' views combine (``_view``) and how a slot state
carries both halves (``_join`` / ``_split``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol

from memory.protocol import ForwardView, IntegrityError, Memory, MemoryBatch, MemoryUsage, SeqState


class Follower(Protocol):
    """What a pair asks its follower before either half changes (none of these change
    anything), beside the ``Memory`` operations."""

    n_seq_max: int

    def check_batch(self, batch: MemoryBatch) -> None:
        """ValueError unless ``prepare(batch)`` would succeed."""

    def can_rm(self, seq: int, p0: int, p1: int | None) -> bool:
        """Whether ``seq_rm(seq, p0, p1)`` would succeed."""

    def check_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """ValueError unless ``seq_cp(src, dst, p0, p1)`` would succeed."""

    def validate_state(self, state: SeqState) -> object:
        """StateMismatch unless ``load_seq(seq, state)`` would succeed."""


class MemoryPair(Memory):
    shift_refusal = "this memory cannot shift positions"

    def __init__(self, lead: Memory, follower: Memory):
        if lead.n_seq_max != follower.n_seq_max:
            raise ValueError("both halves of a memory pair must serve the same sequences")
        self.lead, self.follower = lead, follower
        self.n_seq_max = follower.n_seq_max
        self.checkpoint_every = follower.checkpoint_every

    @abstractmethod
    def _view(self, lead: ForwardView, follower: ForwardView, batch: MemoryBatch) -> ForwardView:
        """The forward's view over both halves' views (models read ``view.batch``)."""

    @abstractmethod
    def _join(self, lead: SeqState, follower: SeqState) -> SeqState:
        """One slot state carrying both halves' states."""

    @abstractmethod
    def _split(self, state: SeqState) -> tuple[SeqState, SeqState]:
        """(lead's, follower's) state from ``_join``'s; StateMismatch if it is not one."""

    def prepare(self, batch: MemoryBatch) -> ForwardView:
        self.follower.check_batch(batch)  # the follower's only refusal, asked first
        lead = self.lead.prepare(batch)  # CacheFull / ValueError: nothing changed
        return self._view(lead, self.follower.prepare(batch), batch)

    def seq_cut_point(self, seq: int, p: int) -> int:
        q = p
        while True:  # each half's cut point is <= what it was asked: this ends, at worst at 0
            r = self.lead.seq_cut_point(seq, self.follower.seq_cut_point(seq, q))
            if r == q or r <= 0:
                return max(r, 0)
            q = r

    @property
    def cuts_anywhere(self) -> bool:
        return self.lead.cuts_anywhere and self.follower.cuts_anywhere

    def checkpoint(self, seq: int, pin: bool = False) -> None:
        self.lead.checkpoint(seq, pin)
        self.follower.checkpoint(seq, pin)

    def hold(self, seq: int) -> None:
        self.lead.hold(seq)
        self.follower.hold(seq)

    def checkpoints(self, seq: int) -> list[int]:
        return self.follower.checkpoints(seq)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        if seq >= 0:
            self._check_seq(seq)
        seqs = range(self.n_seq_max) if seq < 0 else [seq]
        if not all(self.follower.can_rm(s, p0, p1) for s in seqs):
            return False
        if not self.lead.seq_rm(seq, p0, p1):
            return False
        return self.follower.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self.follower.check_cp(src, dst, p0, p1)
        self.lead.seq_cp(src, dst, p0, p1)  # CacheFull: nothing changed
        self.follower.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self.lead.seq_keep(seq)
        self.follower.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        if delta:
            raise NotImplementedError(self.shift_refusal)

    @property
    def can_shift(self) -> bool:
        return False

    def seq_pos_min(self, seq: int) -> int:
        """The lowest position both halves can serve (a window may have forgotten more)."""
        lo = [self.lead.seq_pos_min(seq), self.follower.seq_pos_min(seq)]
        return -1 if min(lo) < 0 else max(lo)

    def seq_pos_max(self, seq: int) -> int:
        return min(self.lead.seq_pos_max(seq), self.follower.seq_pos_max(seq))

    def seq_len(self, seq: int) -> int:
        return self.lead.seq_len(seq)

    def save_seq(self, seq: int) -> SeqState:
        return self._join(self.lead.save_seq(seq), self.follower.save_seq(seq))

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        lead, follower = self._split(state)
        self.follower.validate_state(follower)  # checked before either half changes
        self.lead.load_seq(seq, lead)  # StateMismatch / CacheFull: nothing changed
        self.follower.load_seq(seq, follower)

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        lead, follower = self.lead.usage(held_by), self.follower.usage(held_by)
        return MemoryUsage(kind=self.kind, groups=lead.groups + follower.groups, n_cells_used=lead.n_cells_used)

    def integrity_check(self) -> None:
        self.lead.integrity_check()
        self.follower.integrity_check()
        for seq in range(self.n_seq_max):
            lead, follower = self.lead.seq_pos_max(seq), self.follower.seq_pos_max(seq)
            if lead != follower:
                halves = f"the {self.lead.kind} half ends at {lead}, the {self.follower.kind} half at {follower}"
                raise IntegrityError(f"sequence {seq}: {halves}")
