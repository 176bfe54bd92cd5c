"""Interleaved sliding-window attention (iSWA): full-attention layers and
sliding-window layers side by side, as one ``Memory`` composed of two.

The full layers live in a KV cache of the chosen layout (unified pool or per-stream);
the sliding layers in a ``SlidingKVCache`` whose size is bounded by the window. Every
operation is checked on both children before either changes, so the pair stays
coherent: a cut happens only where both can cut (``seq_cut_point``), a copy only of a
prefix both can copy. Slot states carry both parts: the full layers' cells under the
usual names and positions, the window's cells as ``swa.positions`` plus their layers'
``k.<layer>``/``v.<layer>``.
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
from memory.sliding_kv import SlidingKVCache


class ISWAView(ForwardView):
    def __init__(self, full: ForwardView, swa: ForwardView, swa_layers: set[int]):
        self.full, self.swa, self.swa_layers = full, swa, swa_layers

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        view = self.swa if layer in self.swa_layers else self.full
        return view.attend(layer, q, k, v, scale, softcap)


class ISWAMemory(Memory):
    kind = "kv_iswa"

    def __init__(self, full: Memory, swa: SlidingKVCache):
        self.full, self.swa = full, swa
        self.n_seq_max = swa.n_seq_max
        self.swa_layers = set(swa.specs)

    def prepare(self, batch: MemoryBatch) -> ISWAView:
        full_view = self.full.prepare(batch)  # CacheFull: nothing changed
        try:
            swa_view = self.swa.prepare(batch)
        except BaseException:
            starts = self._first_new_positions(batch)
            for seq, p in starts.items():
                self.full.seq_rm(seq, p)  # a suffix: always possible, never needs room
            raise
        return ISWAView(full_view, swa_view, self.swa_layers)

    @staticmethod
    def _first_new_positions(batch: MemoryBatch) -> dict[int, int]:
        out, row = {}, 0
        for seq, n in zip(batch.seq_ids, batch.n_tokens):
            if n:
                out[seq] = int(batch.positions[row])
            row += n
        return out

    def seq_cut_point(self, seq: int, p: int) -> int:
        return min(self.full.seq_cut_point(seq, p), self.swa.seq_cut_point(seq, p))

    def checkpoints(self, seq: int) -> list[int]:
        return self.swa.checkpoints(seq)

    def checkpoint(self, seq: int) -> None:
        self.full.checkpoint(seq)
        self.swa.checkpoint(seq)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        seqs = range(self.swa.n_seq_max) if seq < 0 else [seq]
        if any(not self.swa._can_rm(s, p0, p1) for s in seqs):
            return False
        if not self.full.seq_rm(seq, p0, p1):
            return False
        return self.swa.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        end = self.full.seq_pos_max(src) + 1 if p1 is None else p1
        if p0 > 0 or self.swa.seq_cut_point(src, end) != min(end, self.swa.n[src]):
            raise ValueError(f"sequence {src} cannot be copied up to {end} (see seq_cut_point)")
        self.full.seq_cp(src, dst, p0, p1)  # CacheFull: nothing changed
        self.swa.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self.full.seq_keep(seq)
        self.swa.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        if delta:
            raise NotImplementedError("an iSWA cache cannot shift positions (start with --swa-full)")

    def seq_pos_min(self, seq: int) -> int:
        """What the window still holds: the lowest position every layer can see."""
        return self.swa.seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.full.seq_pos_max(seq)

    def seq_len(self, seq: int) -> int:
        return self.full.seq_len(seq)

    def save_seq(self, seq: int) -> SeqState:
        full, swa = self.full.save_seq(seq), self.swa.save_seq(seq)
        tensors = {**full.tensors, **swa.tensors, "swa.positions": swa.positions}
        meta = {"memory_kind": self.kind, "layers": full.meta["layers"], "swa_layers": swa.meta["layers"]}
        meta["window"] = swa.meta["window"]
        return SeqState(positions=full.positions, tensors=tensors, meta=meta)

    def load_seq(self, seq: int, state: SeqState) -> None:
        kind = state.meta.get("memory_kind")
        if kind != self.kind or "swa.positions" not in state.tensors:
            raise StateMismatch(f"a '{kind}' state does not restore into an '{self.kind}' memory")
        swa_names = {f"{kv}.{layer}" for layer in self.swa_layers for kv in "kv"}
        full_tensors = {k: t for k, t in state.tensors.items() if k not in swa_names and k != "swa.positions"}
        swa_tensors = {k: t for k, t in state.tensors.items() if k in swa_names}
        full_state = SeqState(state.positions, full_tensors, {"memory_kind": "kv"})
        swa_state = SeqState(state.tensors["swa.positions"], swa_tensors, {"memory_kind": self.swa.kind})
        self.swa.validate_state(swa_state)  # both parts are checked before either changes
        swa_end = int(swa_state.positions[-1]) + 1 if len(swa_state.positions) else 0
        if swa_end != int(state.positions.numel()):
            raise StateMismatch("the window's positions do not end where the sequence ends")
        self.full.load_seq(seq, full_state)  # StateMismatch / CacheFull: nothing changed
        self.swa.load_seq(seq, swa_state)

    @property
    def can_shift(self) -> bool:
        return False

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        full, swa = self.full.usage(held_by), self.swa.usage(held_by)
        return MemoryUsage(kind=self.kind, groups=full.groups + swa.groups, n_cells_used=full.n_cells_used)

    def integrity_check(self) -> None:
        self.full.integrity_check()
        self.swa.integrity_check()
        for seq in range(self.swa.n_seq_max):
            if self.full.seq_pos_max(seq) != self.swa.seq_pos_max(seq):
                ends = (self.full.seq_pos_max(seq), self.swa.seq_pos_max(seq))
                raise IntegrityError(f"sequence {seq}: full layers end at {ends[0]}, the window at {ends[1]}")
