"""Interleaved sliding-window attention (iSWA): full-attention layers and
sliding-window layers side by side, as one ``MemoryPair`` (memory/composite/pair.py).

The full layers live in a KV cache of the chosen layout (unified pool or per-stream),
leading; the sliding layers in a ``SlidingKVCache`` whose size is bounded by the
window, following (it is asked first: it can cut only where its ring or a checkpoint
still holds the window). Slot states carry both parts: the full layers' cells under
the usual names and positions, the window's cells as ``swa.positions`` plus their
layers' ``k.<layer>``/``v.<layer>``.
"""

from __future__ import annotations

import torch

from memory.attention.sliding_kv import SlidingKVCache
from memory.composite.pair import MemoryPair
from memory.protocol import ForwardView, Memory, MemoryBatch, SeqState, StateMismatch


class ISWAView(ForwardView):
    def __init__(self, full: ForwardView, swa: ForwardView, swa_layers: set[int], batch: MemoryBatch):
        self.full, self.swa, self.swa_layers, self.batch = full, swa, swa_layers, batch

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        view = self.swa if layer in self.swa_layers else self.full
        return view.attend(layer, q, k, v, scale, softcap, sinks)


class ISWAMemory(MemoryPair):
    kind = "kv_iswa"
    shift_refusal = "an iSWA cache cannot shift positions (start with --swa-full)"

    def __init__(self, full: Memory, swa: SlidingKVCache):
        super().__init__(full, swa)
        self.full, self.swa = full, swa
        self.swa_layers = set(swa.specs)

    def _view(self, lead: ForwardView, follower: ForwardView, batch: MemoryBatch) -> ISWAView:
        return ISWAView(lead, follower, self.swa_layers, batch)

    def _join(self, lead: SeqState, follower: SeqState) -> SeqState:
        tensors = {**lead.tensors, **follower.tensors, "swa.positions": follower.positions}
        meta = {
            "memory_kind": self.kind,
            "full_kind": lead.meta["memory_kind"],
            "layers": lead.meta["layers"],
            "swa_layers": follower.meta["layers"],
            "window": follower.meta["window"],
        }
        return SeqState(positions=lead.positions, tensors=tensors, meta=meta)

    def _split(self, state: SeqState) -> tuple[SeqState, SeqState]:
        kind = state.meta.get("memory_kind")
        if kind != self.kind or "swa.positions" not in state.tensors:
            raise StateMismatch(f"a '{kind}' state does not restore into an '{self.kind}' memory")
        swa_names = {f"{kv}.{layer}" for layer in self.swa_layers for kv in "kv"}
        full_tensors = {k: t for k, t in state.tensors.items() if k not in swa_names and k != "swa.positions"}
        swa_tensors = {k: t for k, t in state.tensors.items() if k in swa_names}
        # the full part keeps the kind that saved it (a unified or per-stream cache: either restores)
        full = SeqState(state.positions, full_tensors, {"memory_kind": state.meta.get("full_kind", self.full.kind)})
        swa = SeqState(state.tensors["swa.positions"], swa_tensors, {"memory_kind": self.swa.kind})
        swa_end = int(swa.positions[-1]) + 1 if len(swa.positions) else 0
        if swa_end != int(state.positions.numel()):
            raise StateMismatch("the window's positions do not end where the sequence ends")
        return full, swa
