"""Recurrent memory: one fixed-size state per sequence and layer (Mamba's convolution
window and SSM state), plus snapshots of it (*checkpoints*) to come back to.

A recurrent state summarizes every position it has consumed and cannot forget a
suffix. So, unlike the attention caches:

- ``seq_rm`` succeeds only where it can be exact: the whole sequence, a range past the
  end (nothing to do), or back to a position ``p`` the sequence holds a checkpoint for
  (the state is put back to it). A range in the middle, or a cut with no checkpoint,
  returns False with nothing changed.
- ``seq_cut_point(seq, p)`` is ``p`` itself at or past the end, else the latest
  checkpoint at or before ``p`` (0 if none): where prefix reuse and rollback restart,
  recomputing the rest.
- ``seq_cp`` copies the state (or the checkpoint at the cut) and the checkpoints before it.
- ``seq_add`` (context shift) is not supported.

A sequence consumes positions 0, 1, ... in order. ``checkpoint(seq)`` snapshots the
current state; the engine calls it at the end of every prompt and whenever a sequence
reaches a multiple of ``checkpoint_every`` (its planner ends prefill chunks there).
Each sequence keeps ``n_checkpoints`` snapshots (its first and its newest); each
costs one state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memory.kind_base import ForgettingKind
from memory.protocol import (
    ForwardView,
    GroupUsage,
    IntegrityError,
    MemoryBatch,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.snapshot_shelf import SnapshotShelf
from memory.spec import RecurrentSpec


@dataclass(frozen=True)
class Snapshot:
    """A sequence's state after consuming positions [0, end): per layer conv and SSM."""

    end: int
    conv: dict[int, torch.Tensor]
    ssm: dict[int, torch.Tensor]


class RecurrentMemory(ForgettingKind):
    kind = "recurrent"
    copies = "a recurrent state"
    shift_refusal = "a recurrent state cannot shift positions"

    def __init__(
        self,
        layer_specs: dict[int, RecurrentSpec],
        n_seq_max: int,
        device: torch.device | str = "cpu",
        n_checkpoints: int = 4,
        checkpoint_every: int | None = None,
    ):
        if n_seq_max <= 0 or n_checkpoints < 0 or (checkpoint_every is not None and checkpoint_every <= 0):
            raise ValueError("n_seq_max must be positive, n_checkpoints >= 0, checkpoint_every positive")
        self.specs = dict(layer_specs)
        self.n_seq_max = n_seq_max
        self.device = torch.device(device)
        self.n_checkpoints = n_checkpoints
        self.checkpoint_every = checkpoint_every
        dev = self.device
        self.conv = {
            la: torch.zeros((n_seq_max, *s.conv_shape), dtype=s.dtype, device=dev) for la, s in self.specs.items()
        }
        self.ssm = {
            la: torch.zeros((n_seq_max, *s.ssm_shape), dtype=s.dtype, device=dev) for la, s in self.specs.items()
        }
        self.n = [0] * n_seq_max  # positions consumed
        self.snaps: SnapshotShelf[Snapshot] = SnapshotShelf(n_seq_max, n_checkpoints)

    @property
    def bytes_per_seq(self) -> int:
        return sum(s.bytes_per_seq for s in self.specs.values())

    # ---- helpers -------------------------------------------------------------------

    def _snapshot(self, seq: int) -> Snapshot:
        conv = {la: t[seq].clone() for la, t in self.conv.items()}
        ssm = {la: t[seq].clone() for la, t in self.ssm.items()}
        return Snapshot(self.n[seq], conv, ssm)

    def _restore(self, seq: int, snap: Snapshot) -> None:
        for la in self.specs:
            self.conv[la][seq].copy_(snap.conv[la])
            self.ssm[la][seq].copy_(snap.ssm[la])
        self.n[seq] = snap.end

    def _clear(self, seq: int) -> None:
        for la in self.specs:
            self.conv[la][seq].zero_()
            self.ssm[la][seq].zero_()
        self.n[seq] = 0
        self.snaps.clear(seq)

    # ---- protocol ------------------------------------------------------------------

    def check_batch(self, batch: MemoryBatch) -> None:
        """ValueError unless every sequence's new positions follow its last one (no change)."""
        batch.check()
        positions, start = batch.positions.cpu(), 0
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            mine = positions[start : start + n_new]
            if n_new and not torch.equal(mine, torch.arange(self.n[seq], self.n[seq] + n_new)):
                raise ValueError(f"sequence {seq}: new positions must follow its last one ({self.n[seq] - 1})")
            start += n_new

    def prepare(self, batch: MemoryBatch) -> RecurrentView:
        self.check_batch(batch)
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self.n[seq] += n_new
        return RecurrentView(self, batch)

    def _can_cut(self, seq: int, q: int) -> bool:
        return q == self.n[seq] or self.snaps.at(seq, q) is not None

    def _snapshot_end(self, seq: int) -> Snapshot:
        return self._snapshot(seq)

    def seq_cut_point(self, seq: int, p: int) -> int:
        self._check_seq(seq)
        if p >= self.n[seq]:
            return self.n[seq]
        return self.snaps.latest(seq, p)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        if seq < 0:
            if not all(self.can_rm(s, p0, p1) for s in range(self.n_seq_max)):
                return False
            for s in range(self.n_seq_max):
                self.seq_rm(s, p0, p1)
            return True
        self._check_seq(seq)
        if not self.can_rm(seq, p0, p1):
            return False
        n = self.n[seq]
        if max(p0, 0) >= n:
            return True
        if p0 <= 0:
            self._clear(seq)
            return True
        if p0 < n:  # a checkpoint at p0 exists (checked)
            self._restore(seq, self.snaps.at(seq, p0))
            self.snaps.cut(seq, p0)
        return True

    def can_rm(self, seq: int, p0: int, p1: int | None) -> bool:
        """Whether ``seq_rm(seq, p0, p1)`` would succeed (no change)."""
        n = self.n[seq]
        if max(p0, 0) >= n:
            return True  # nothing held in the range
        if p1 is not None and p1 < n:
            return False  # positions from the middle: a state cannot forget them
        return p0 <= 0 or self.snaps.at(seq, p0) is not None

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self.check_cp(src, dst, p0, p1)
        if src == dst:
            return
        q = self.n[src] if p1 is None else min(p1, self.n[src])
        snap = self._snapshot(src) if q == self.n[src] else self.snaps.at(src, q)
        self._clear(dst)
        if q > 0:
            self._restore(dst, snap)
        self.snaps.copy(src, dst, q)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return 0 if self.n[seq] else -1

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return self.n[seq]

    def save_seq(self, seq: int) -> SeqState:
        """The current state and every checkpoint: ``conv.<layer>`` / ``ssm.<layer>``,
        and ``ckpt<i>.conv.<layer>`` / ``ckpt<i>.ssm.<layer>`` for checkpoint i (ends in
        ``meta["checkpoints"]``; those that are a prompt's end in ``meta["pinned"]``, so a
        restored slot keeps them past later ones). ``positions`` is 0..n-1 (one per
        consumed token)."""
        self._check_seq(seq)
        tensors: dict[str, torch.Tensor] = {}
        kept = self.snaps.of(seq)
        for i, snap in enumerate([*kept, self._snapshot(seq)]):
            prefix = f"ckpt{i}." if i < len(kept) else ""
            for la in self.specs:
                tensors[f"{prefix}conv.{la}"] = snap.conv[la].to("cpu", copy=True)
                tensors[f"{prefix}ssm.{la}"] = snap.ssm[la].to("cpu", copy=True)
        meta = {
            "memory_kind": self.kind,
            "layers": ",".join(str(la) for la in self.specs),
            "checkpoints": ",".join(str(e) for e in self.snaps.ends(seq)),
            "pinned": ",".join(str(e) for e in self.snaps.pinned(seq)),
        }
        return SeqState(positions=torch.arange(self.n[seq]), tensors=tensors, meta=meta)

    def validate_state(self, state: SeqState) -> tuple[int, list[int], set[int]]:
        """(n, checkpoint ends, pinned ends) of a state ``load_seq`` accepts; StateMismatch
        otherwise. A state saved before pins were (no ``pinned``) has none."""
        kind = state.meta.get("memory_kind")
        if kind != self.kind:
            raise StateMismatch(f"the state is of a '{kind}' memory; this one is '{self.kind}'")
        if state.meta.get("layers") != ",".join(str(la) for la in self.specs):
            raise StateMismatch("the state's recurrent layers differ from this model's")
        n = int(state.positions.numel())
        if not torch.equal(state.positions.to(torch.long), torch.arange(n)):
            raise StateMismatch("recurrent positions must be 0..n-1")
        ends = _ends(state.meta.get("checkpoints", ""))
        if ends != sorted(set(ends)) or any(not 0 < e <= n for e in ends):
            raise StateMismatch("checkpoints must be increasing positions within the sequence")
        pinned = set(_ends(state.meta.get("pinned", "")))
        if not pinned <= set(ends):
            raise StateMismatch("pinned checkpoints must be among the checkpoints")
        expected = {
            f"{p}{what}.{la}"
            for p in ["", *(f"ckpt{i}." for i in range(len(ends)))]
            for what in ("conv", "ssm")
            for la in self.specs
        }
        if set(state.tensors) != expected:
            raise StateMismatch("the state's tensors do not match this model's recurrent layers")
        for name, t in state.tensors.items():
            spec = self.specs[int(name.rsplit(".", 1)[1])]
            shape = spec.conv_shape if name.split(".")[-2] == "conv" else spec.ssm_shape
            if tuple(t.shape) != tuple(shape):
                raise StateMismatch(f"tensor '{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return n, ends, pinned

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        n, ends, pinned = self.validate_state(state)

        def snap(prefix: str, end: int) -> Snapshot:
            conv = {la: state.tensors[f"{prefix}conv.{la}"].to(self.device, s.dtype) for la, s in self.specs.items()}
            ssm = {la: state.tensors[f"{prefix}ssm.{la}"].to(self.device, s.dtype) for la, s in self.specs.items()}
            return Snapshot(end, conv, ssm)

        snaps = [snap(f"ckpt{i}.", end) for i, end in enumerate(ends)]
        current = snap("", n)
        self._clear(seq)
        self._restore(seq, current)
        self.snaps.put(seq, snaps, pinned)

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        """A block is one sequence's whole state; checkpoints count as blocks too."""
        held = set(held_by)
        per_seq = lambda s: (1 if self.n[s] else 0) + len(self.snaps.of(s))  # noqa: E731
        group = GroupUsage(
            kind="recurrent",
            n_layers=len(self.specs),
            block_tokens=0,
            n_blocks_total=self.n_seq_max * (1 + self.n_checkpoints),
            n_blocks_used=sum(per_seq(s) for s in range(self.n_seq_max)),
            n_blocks_held=sum(per_seq(s) for s in held),
            bytes_per_block=self.bytes_per_seq,
        )
        return MemoryUsage(kind=self.kind, groups=(group,), n_cells_used=sum(self.n))

    def integrity_check(self) -> None:
        for seq in range(self.n_seq_max):
            problem = "a negative length" if self.n[seq] < 0 else self.snaps.problem(seq, self.n[seq])
            if problem:
                raise IntegrityError(f"sequence {seq}: {problem}")


class RecurrentView(ForwardView):
    """The batch's sequences as rows of state: ``states(layer)`` gathers them in batch
    order (copies; a batch whose sequences are consecutive slots in order, one sequence
    or a decode batch of slots 0..7, gets views of their rows, which a layer may update
    in place), ``store(layer, ...)`` writes the updated ones back (nothing to do for a
    view updated in place)."""

    def __init__(self, memory: RecurrentMemory, batch: MemoryBatch):
        self.memory = memory
        self.batch = batch
        self.index = torch.tensor(batch.seq_ids, dtype=torch.long, device=memory.device)  # [B]
        first, ids = batch.seq_ids[0], batch.seq_ids
        self.run = slice(first, first + len(ids)) if ids == list(range(first, first + len(ids))) else None

    def attend(self, layer, q, k, v, scale=None, softcap=None, sinks=None):
        raise NotImplementedError("a recurrent memory has no attention layers")

    def states(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        conv, ssm = self.memory.conv[layer], self.memory.ssm[layer]
        if self.run is not None:
            return conv[self.run], ssm[self.run]  # [B, ...] views
        return conv.index_select(0, self.index), ssm.index_select(0, self.index)

    def store(self, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        for target, new in ((self.memory.conv[layer], conv), (self.memory.ssm[layer], ssm)):
            if self.run is not None:
                rows = target[self.run]
                if new.data_ptr() != rows.data_ptr():
                    rows.copy_(new)
            else:
                target.index_copy_(0, self.index, new.to(target.dtype))


def _ends(raw: str) -> list[int]:
    """A saved list of checkpoint ends ("4,16"); StateMismatch when it is not one."""
    try:
        return [int(x) for x in raw.split(",")] if raw else []
    except ValueError:
        raise StateMismatch(f"bad checkpoint list '{raw}'") from None
