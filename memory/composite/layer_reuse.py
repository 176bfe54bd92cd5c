"""Layers that read another layer's cache (Gemma 3n's KV sharing) on top of any memory.

A ``ReuseSpec(target)`` layer stores nothing: its queries attend to the keys and values
``target`` stored (in the same step too: the target layer runs first), through the
target's window if it has one. The inner memory is built from the layers that own a
cache; this wrapper only re-routes ``attend``, so every other operation (cuts, copies,
slot files, statistics) is the inner memory's, and no storage is counted for the
reusing layers.
"""

from __future__ import annotations

import torch

from memory.protocol import ForwardView, Memory, MemoryBatch, MemoryUsage, SeqState


class ReuseView(ForwardView):
    def __init__(self, inner: ForwardView, targets: dict[int, int]):
        self.inner, self.targets = inner, targets

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        target = self.targets.get(layer)
        if target is None:
            return self.inner.attend(layer, q, k, v, scale, softcap, sinks)
        return self.inner.attend(target, q, None, None, scale, softcap, sinks)  # read only: nothing stored

    def states(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.states(layer)

    def store(self, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self.inner.store(layer, conv, ssm)


class LayerReuse(Memory):
    """``targets``: reusing layer -> the layer whose cache it reads."""

    def __init__(self, inner: Memory, targets: dict[int, int]):
        self.inner, self.targets = inner, dict(targets)
        self.kind = inner.kind
        self.n_seq_max, self.checkpoint_every = inner.n_seq_max, inner.checkpoint_every

    def prepare(self, batch: MemoryBatch) -> ReuseView:
        return ReuseView(self.inner.prepare(batch), self.targets)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        return self.inner.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self.inner.seq_cp(src, dst, p0, p1)

    def seq_cut_point(self, seq: int, p: int) -> int:
        return self.inner.seq_cut_point(seq, p)

    def checkpoints(self, seq: int) -> list[int]:
        return self.inner.checkpoints(seq)

    def checkpoint(self, seq: int, pin: bool = False) -> None:
        self.inner.checkpoint(seq, pin)

    def hold(self, seq: int) -> None:
        self.inner.hold(seq)

    def seq_keep(self, seq: int) -> None:
        self.inner.seq_keep(seq)

    def publish_prefix(self, seq: int, tokens: list[int]) -> None:
        self.inner.publish_prefix(seq, tokens)

    def cached_prefix(self, tokens: list[int]) -> int:
        return self.inner.cached_prefix(tokens)

    def attach_prefix(self, seq: int, tokens: list[int]) -> int:
        return self.inner.attach_prefix(seq, tokens)

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        self.inner.seq_add(seq, p0, p1, delta)

    def seq_pos_min(self, seq: int) -> int:
        return self.inner.seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.inner.seq_pos_max(seq)

    def seq_len(self, seq: int) -> int:
        return self.inner.seq_len(seq)

    def save_seq(self, seq: int) -> SeqState:
        return self.inner.save_seq(seq)

    def load_seq(self, seq: int, state: SeqState) -> None:
        self.inner.load_seq(seq, state)

    @property
    def cuts_anywhere(self) -> bool:
        return self.inner.cuts_anywhere

    @property
    def can_shift(self) -> bool:
        return self.inner.can_shift

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        return self.inner.usage(held_by)

    def integrity_check(self) -> None:
        self.inner.integrity_check()
