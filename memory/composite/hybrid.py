"""Hybrid memory: the attention layers' memory (any KV kind: unified, per-stream, iSWA)
leading, the recurrent layers' states (``RecurrentMemory``) following, as one
``MemoryPair`` (memory/composite/pair.py: the recurrent half is asked first, since it can only go
back to a checkpoint).

Slot states carry both halves: the attention half's state as it is (its positions are
the state's positions), and the recurrent half's tensors under ``rec.``-prefixed names
with its metadata under ``rec.``-prefixed keys.
"""

from __future__ import annotations

import torch

from memory.composite.pair import MemoryPair
from memory.protocol import ForwardView, Memory, MemoryBatch, SeqState, StateMismatch
from memory.recurrent.recurrent_memory import RecurrentMemory

REC = "rec."


class HybridView(ForwardView):
    def __init__(self, attn: ForwardView, rec: ForwardView, batch: MemoryBatch):
        self.attn, self.rec, self.batch = attn, rec, batch

    def attend(self, layer, q, k, v, scale=None, softcap=None, sinks=None) -> torch.Tensor:
        return self.attn.attend(layer, q, k, v, scale, softcap, sinks)

    def states(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rec.states(layer)

    def store(self, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self.rec.store(layer, conv, ssm)


class HybridMemory(MemoryPair):
    kind = "hybrid"
    shift_refusal = "a hybrid memory cannot shift positions: its recurrent states cannot"

    def __init__(self, attn: Memory, rec: RecurrentMemory):
        super().__init__(attn, rec)
        self.attn, self.rec = attn, rec

    def _view(self, lead: ForwardView, follower: ForwardView, batch: MemoryBatch) -> HybridView:
        return HybridView(lead, follower, batch)

    def _join(self, lead: SeqState, follower: SeqState) -> SeqState:
        tensors = {**lead.tensors, **{REC + k: t for k, t in follower.tensors.items()}}
        meta = {**lead.meta, **{REC + k: v for k, v in follower.meta.items()}, "hybrid": "1"}
        return SeqState(positions=lead.positions, tensors=tensors, meta=meta)

    def _split(self, state: SeqState) -> tuple[SeqState, SeqState]:
        if state.meta.get("hybrid") != "1":
            raise StateMismatch("the state is not a hybrid model's (attention and recurrent layers)")
        attn_t = {k: t for k, t in state.tensors.items() if not k.startswith(REC)}
        rec_t = {k[len(REC) :]: t for k, t in state.tensors.items() if k.startswith(REC)}
        attn_m = {k: v for k, v in state.meta.items() if not k.startswith(REC) and k != "hybrid"}
        rec_m = {k[len(REC) :]: v for k, v in state.meta.items() if k.startswith(REC)}
        n = int(state.positions.numel())
        return SeqState(state.positions, attn_t, attn_m), SeqState(torch.arange(n), rec_t, rec_m)
