"""The plumbing the storing kinds share, once (memory/protocol.py is the contract).

``MemoryKind``: ``seq_keep`` clears every other sequence through the kind's ``_clear``;
``seq_add`` checks its sequence, ignores a zero shift and refuses (``shift_refusal``)
when the kind cannot shift, before the kind's ``_shift`` does the work.

``ForgettingKind``: kinds that keep a window or a state rather than every position
(sliding windows, recurrent states). They copy prefixes only, cut only where
``_can_cut`` says (they hold what a query there needs, or kept a snapshot on their
``snaps`` shelf), snapshot a prompt's end (``_snapshot_end``), and never shift."""

from __future__ import annotations

from abc import abstractmethod

from memory.protocol import Memory
from memory.snapshot_shelf import SnapshotShelf


class MemoryKind(Memory):
    shift_refusal = "this cache cannot shift positions"

    @abstractmethod
    def _clear(self, seq: int) -> None:
        """Drop everything ``seq`` holds."""

    def _shift(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        """Shift ``seq``'s positions in [p0, p1) by ``delta`` != 0 (``can_shift`` is true)."""
        raise NotImplementedError(self.shift_refusal)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq)
        for other in range(self.n_seq_max):
            if other != seq:
                self._clear(other)

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        self._check_seq(seq)
        if delta == 0:
            return
        if not self.can_shift:
            raise NotImplementedError(self.shift_refusal)
        self._shift(seq, p0, p1, delta)


class ForgettingKind(MemoryKind):
    n: list[int]  # per sequence: positions consumed (its end)
    snaps: SnapshotShelf
    copies = "this memory"  # what the kind is called in its refusals ("a recurrent state")

    @abstractmethod
    def _can_cut(self, seq: int, q: int) -> bool:
        """Whether ``seq`` can be cut at ``q`` <= its end, keeping what a query there needs."""

    @abstractmethod
    def _snapshot_end(self, seq: int) -> object:
        """A snapshot of ``seq`` at its end, for the shelf."""

    @property
    def can_shift(self) -> bool:
        return False

    @property
    def cuts_anywhere(self) -> bool:
        return False  # only where it holds what a query needs, or kept a snapshot

    def check_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """ValueError unless ``seq_cp(src, dst, p0, p1)`` can be done (no change): a
        prefix, up to a cut point (``seq_cut_point``)."""
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        if p0 > 0:
            raise ValueError(f"{self.copies} copies prefixes only")
        q = self.n[src] if p1 is None else min(p1, self.n[src])
        if not self._can_cut(src, q):
            raise ValueError(f"sequence {src} cannot be cut at {q} (see seq_cut_point)")

    def checkpoint(self, seq: int, pin: bool = False) -> None:
        self._check_seq(seq)
        end = self.n[seq]
        if end > 0 and self.snaps.keep and self.snaps.at(seq, end) is None:
            self.snaps.add(seq, self._snapshot_end(seq), pin)
        elif pin and end in self.snaps.ends(seq):
            self.snaps.pin(seq, end)

    def hold(self, seq: int) -> None:
        self._check_seq(seq)
        if self.n[seq] > 0:
            self.snaps.hold(seq, self._snapshot_end(seq))

    def checkpoints(self, seq: int) -> list[int]:
        """Positions ``seq`` can be put back to (its snapshots' ends), oldest first."""
        self._check_seq(seq)
        return self.snaps.ends(seq)

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return self.n[seq] - 1
