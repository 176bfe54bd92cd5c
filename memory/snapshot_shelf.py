"""The snapshot shelf (llama-server's context checkpoints): per sequence, the snapshots a
memory that forgets keeps to come back to (recurrent states, sliding windows). The snapshot's contents are the memory's
business; this keeps the bookkeeping both kinds share.

A snapshot has an ``end``: the position it was taken at (it stands for positions
[0, end)). Each sequence keeps its newest ``keep`` snapshots, by increasing end, one
per end. Snapshots are never written in place, so sequences may share them (a prefix
copy shares the source's snapshots before the cut).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class Snap(Protocol):
    @property
    def end(self) -> int: ...


S = TypeVar("S", bound=Snap)


class SnapshotShelf(Generic[S]):
    def __init__(self, n_seq_max: int, keep: int):
        if keep < 0:
            raise ValueError("the number of checkpoints kept must be >= 0")
        self.keep = keep
        self.by_seq: list[list[S]] = [[] for _ in range(n_seq_max)]

    def of(self, seq: int) -> list[S]:
        """``seq``'s snapshots, oldest first (do not mutate)."""
        return self.by_seq[seq]

    def ends(self, seq: int) -> list[int]:
        return [s.end for s in self.by_seq[seq]]

    def at(self, seq: int, end: int) -> S | None:
        """The snapshot of ``seq`` taken at ``end``, if kept."""
        return next((s for s in self.by_seq[seq] if s.end == end), None)

    def latest(self, seq: int, p: int) -> int:
        """The end of the newest snapshot at or before ``p`` (0 if none)."""
        return max((s.end for s in self.by_seq[seq] if s.end <= p), default=0)

    def add(self, seq: int, snap: S) -> None:
        """Keep ``snap`` (after every kept one), dropping the oldest beyond ``keep``."""
        self.by_seq[seq] = [*self.by_seq[seq], snap][-self.keep :] if self.keep else []

    def put(self, seq: int, snaps: list[S]) -> None:
        """Replace ``seq``'s snapshots (the newest ``keep`` of them)."""
        self.by_seq[seq] = list(snaps)[-self.keep :] if self.keep else []

    def cut(self, seq: int, p: int) -> None:
        """Forget ``seq``'s snapshots taken after ``p``."""
        self.by_seq[seq] = [s for s in self.by_seq[seq] if s.end <= p]

    def copy(self, src: int, dst: int, p: int) -> None:
        """``dst`` shares ``src``'s snapshots up to ``p``."""
        self.by_seq[dst] = [s for s in self.by_seq[src] if s.end <= p]

    def clear(self, seq: int) -> None:
        self.by_seq[seq] = []

    def problem(self, seq: int, n: int) -> str | None:
        """What is wrong with ``seq``'s snapshots for a sequence of ``n`` positions, or None."""
        ends = self.ends(seq)
        if any(not 0 < e <= n for e in ends) or ends != sorted(set(ends)):
            return f"checkpoints {ends} do not fit its {n} positions"
        if len(ends) > self.keep:
            return f"{len(ends)} checkpoints, at most {self.keep}"
        return None
