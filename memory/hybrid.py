"""Hybrid memory: the attention layers' memory (any KV kind: unified, per-stream, iSWA)
and the recurrent layers' states (``RecurrentMemory``) behind one ``Memory``.

Every operation is all-or-nothing across both halves. The recurrent half is the one
that refuses most (it can only go back to a checkpoint), so each operation first asks
it, without changing anything, whether it can follow; then the attention half acts
(it may still refuse or raise, e.g. ``CacheFull``, leaving itself unchanged); only then
the recurrent half, which can no longer fail. A cut point is one both halves can cut
at; positions held are what both can serve.

Slot states carry both halves: the attention half's state as it is (its positions are
the state's positions), and the recurrent half's tensors under ``rec.``-prefixed names
with its metadata under ``rec.``-prefixed keys.
"""

from __future__ import annotations

import torch

from memory.protocol import (
    ForwardView,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.recurrent import RecurrentMemory

REC = "rec."


class HybridView(ForwardView):
    def __init__(self, attn: ForwardView, rec: ForwardView, batch: MemoryBatch):
        self.attn, self.rec, self.batch = attn, rec, batch

    def attend(self, layer, q, k, v, scale=None, softcap=None) -> torch.Tensor:
        return self.attn.attend(layer, q, k, v, scale, softcap)

    def states(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rec.states(layer)

    def store(self, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self.rec.store(layer, conv, ssm)


class HybridMemory(Memory):
    kind = "hybrid"

    def __init__(self, attn: Memory, rec: RecurrentMemory):
        if attn.n_seq_max != rec.n_seq_max:
            raise ValueError("both halves of a hybrid memory must serve the same sequences")
        self.attn, self.rec = attn, rec
        self.n_seq_max = rec.n_seq_max
        self.checkpoint_every = rec.checkpoint_every

    def prepare(self, batch: MemoryBatch) -> HybridView:
        self.rec.check_batch(batch)  # the recurrent half's only refusal, asked first
        attn_view = self.attn.prepare(batch)  # CacheFull / ValueError: nothing changed
        return HybridView(attn_view, self.rec.prepare(batch), batch)

    def seq_cut_point(self, seq: int, p: int) -> int:
        q = p
        while True:  # each half's cut point is <= what it was asked: this ends, at worst at 0
            r = self.attn.seq_cut_point(seq, self.rec.seq_cut_point(seq, q))
            if r == q or r <= 0:
                return max(r, 0)
            q = r

    def checkpoint(self, seq: int) -> None:
        self.attn.checkpoint(seq)
        self.rec.checkpoint(seq)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        seqs = range(self.n_seq_max) if seq < 0 else [seq]
        if seq >= 0:
            self._check_seq(seq)
        if not all(self.rec.can_rm(s, p0, p1) for s in seqs):
            return False
        if not self.attn.seq_rm(seq, p0, p1):
            return False
        return self.rec.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self.rec.check_cp(src, dst, p0, p1)
        self.attn.seq_cp(src, dst, p0, p1)  # CacheFull: nothing changed
        self.rec.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self.attn.seq_keep(seq)
        self.rec.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        if delta:
            raise NotImplementedError("a hybrid memory cannot shift positions: its recurrent states cannot")

    def seq_pos_min(self, seq: int) -> int:
        lo = [self.attn.seq_pos_min(seq), self.rec.seq_pos_min(seq)]
        return -1 if min(lo) < 0 else max(lo)

    def seq_pos_max(self, seq: int) -> int:
        return min(self.attn.seq_pos_max(seq), self.rec.seq_pos_max(seq))

    def seq_len(self, seq: int) -> int:
        return self.attn.seq_len(seq)

    def checkpoints(self, seq: int) -> list[int]:
        return self.rec.checkpoints(seq)

    def save_seq(self, seq: int) -> SeqState:
        attn, rec = self.attn.save_seq(seq), self.rec.save_seq(seq)
        tensors = {**attn.tensors, **{REC + k: t for k, t in rec.tensors.items()}}
        meta = {**attn.meta, **{REC + k: v for k, v in rec.meta.items()}, "hybrid": "1"}
        return SeqState(positions=attn.positions, tensors=tensors, meta=meta)

    def _split(self, state: SeqState) -> tuple[SeqState, SeqState]:
        if state.meta.get("hybrid") != "1":
            raise StateMismatch("the state is not a hybrid model's (attention and recurrent layers)")
        attn_t = {k: t for k, t in state.tensors.items() if not k.startswith(REC)}
        rec_t = {k[len(REC) :]: t for k, t in state.tensors.items() if k.startswith(REC)}
        attn_m = {k: v for k, v in state.meta.items() if not k.startswith(REC) and k != "hybrid"}
        rec_m = {k[len(REC) :]: v for k, v in state.meta.items() if k.startswith(REC)}
        n = int(state.positions.numel())
        return SeqState(state.positions, attn_t, attn_m), SeqState(torch.arange(n), rec_t, rec_m)

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        attn, rec = self._split(state)
        self.rec.validate_state(rec)  # checked before either half changes
        self.attn.load_seq(seq, attn)  # StateMismatch / CacheFull: unchanged
        self.rec.load_seq(seq, rec)

    @property
    def can_shift(self) -> bool:
        return False

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        attn, rec = self.attn.usage(held_by), self.rec.usage(held_by)
        return MemoryUsage(kind=self.kind, groups=attn.groups + rec.groups, n_cells_used=attn.n_cells_used)

    def integrity_check(self) -> None:
        self.attn.integrity_check()
        self.rec.integrity_check()
        for seq in range(self.n_seq_max):
            if self.attn.seq_pos_max(seq) != self.rec.seq_pos_max(seq):
                raise IntegrityError(
                    f"sequence {seq}: attention holds up to {self.attn.seq_pos_max(seq)}, "
                    f"the recurrent state {self.rec.seq_pos_max(seq)}"
                )
