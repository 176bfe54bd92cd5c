"""The snapshot shelf (llama-server's context checkpoints): per sequence, the snapshots a
memory that forgets keeps to come back to (recurrent states, sliding windows). The
snapshot's contents are the memory's business; this keeps the bookkeeping both kinds
share.

A snapshot has an ``end``: the position it was taken at (it stands for positions
[0, end)). Each sequence keeps at most ``keep`` snapshots, by increasing end, one per
end: the oldest pinned one (a prompt's end), or else its first, and its newest
(``add``). Snapshots are never written in place, so sequences may share them (a
prefix copy shares the source's snapshots before the cut, and their pins). Besides
those, a sequence may hold one transient snapshot (``hold``: speculation's rollback
point) that cuts may use but that is never listed, saved or copied.
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
        self.held: list[S | None] = [None] * n_seq_max  # one transient snapshot each (``hold``)
        self.pins: list[set[int]] = [set() for _ in range(n_seq_max)]  # ends of pinned snapshots (prompt ends)

    def of(self, seq: int) -> list[S]:
        """``seq``'s snapshots, oldest first (do not mutate)."""
        return self.by_seq[seq]

    def ends(self, seq: int) -> list[int]:
        return [s.end for s in self.by_seq[seq]]

    def at(self, seq: int, end: int) -> S | None:
        """The snapshot of ``seq`` taken at ``end``, if kept (or held)."""
        held = self.held[seq]
        return next((s for s in self.by_seq[seq] if s.end == end), held if held and held.end == end else None)

    def latest(self, seq: int, p: int) -> int:
        """The end of the newest snapshot (kept or held) at or before ``p`` (0 if none)."""
        held = self.held[seq]
        ends = [s.end for s in self.by_seq[seq]] + ([held.end] if held else [])
        return max((e for e in ends if e <= p), default=0)

    def hold(self, seq: int, snap: S) -> None:
        """Hold ``snap`` aside, replacing any held before, without touching the kept ones
        (speculation's checkpoint before a proposal is verified: rejected tokens are
        undone by cutting back to it). It is not listed, saved or copied."""
        self.held[seq] = snap

    def add(self, seq: int, snap: S, pin: bool = False) -> None:
        """Keep ``snap`` (after every kept one; ``pin``: a prompt's end). Beyond ``keep``
        the oldest goes but one: the oldest pinned snapshot (the end of the conversation's
        first prompt, what other conversations with the same start restart from), or the
        first where none is pinned; the newest stay."""
        if pin:
            self.pins[seq].add(snap.end)
        kept = [*self.by_seq[seq], snap]
        if len(kept) > self.keep:
            pinned = [s for s in kept if s.end in self.pins[seq]]
            stays = (pinned or kept)[0] if self.keep > 1 else None
            rest = [s for s in kept if s is not stays]
            rest = rest[len(rest) - self.keep + (stays is not None) :]
            kept = sorted([stays, *rest], key=lambda s: s.end) if stays is not None else rest
        self.by_seq[seq] = kept if self.keep else []
        self.pins[seq] &= {s.end for s in self.by_seq[seq]}

    def pin(self, seq: int, end: int) -> None:
        """Mark ``seq``'s kept snapshot at ``end`` as a prompt's end (see ``add``)."""
        self.pins[seq].add(end)

    def put(self, seq: int, snaps: list[S], pins: set[int] | frozenset[int] = frozenset()) -> None:
        """Replace ``seq``'s snapshots (the newest ``keep`` of them) and their pins (the
        ends in ``pins`` that are kept: a restored slot file's prompt ends)."""
        self.by_seq[seq] = list(snaps)[-self.keep :] if self.keep else []
        self.held[seq] = None
        self.pins[seq] = set(pins) & {s.end for s in self.by_seq[seq]}

    def pinned(self, seq: int) -> list[int]:
        """The ends of ``seq``'s pinned snapshots, oldest first."""
        return sorted(self.pins[seq])

    def cut(self, seq: int, p: int) -> None:
        """Forget ``seq``'s snapshots taken after ``p``."""
        self.by_seq[seq] = [s for s in self.by_seq[seq] if s.end <= p]
        self.pins[seq] = {e for e in self.pins[seq] if e <= p}
        if self.held[seq] is not None and self.held[seq].end > p:
            self.held[seq] = None

    def copy(self, src: int, dst: int, p: int) -> None:
        """``dst`` shares ``src``'s snapshots up to ``p`` (not the held one)."""
        self.by_seq[dst] = [s for s in self.by_seq[src] if s.end <= p]
        self.pins[dst] = {e for e in self.pins[src] if e <= p}
        self.held[dst] = None

    def clear(self, seq: int) -> None:
        self.by_seq[seq] = []
        self.held[seq] = None
        self.pins[seq] = set()

    def problem(self, seq: int, n: int) -> str | None:
        """What is wrong with ``seq``'s snapshots for a sequence of ``n`` positions, or None."""
        ends = self.ends(seq)
        if any(not 0 < e <= n for e in ends) or ends != sorted(set(ends)):
            return f"checkpoints {ends} do not fit its {n} positions"
        if len(ends) > self.keep:
            return f"{len(ends)} checkpoints, at most {self.keep}"
        return None
