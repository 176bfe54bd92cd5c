"""Reference-counted pool of fixed-size block ids (bookkeeping only, no tensors)."""

from __future__ import annotations

from collections import deque

from memory.protocol import CacheFull, IntegrityError


class BlockPool:
    """A free list plus a reference count per block.

    ``allocate`` is all-or-nothing; ``release`` returns a block to the free list when
    its count reaches zero. Blocks are handed out lowest-id-first after a reset, then
    in release order (recently freed blocks are reused first: they are warm in cache).
    """

    def __init__(self, n_blocks: int):
        if n_blocks <= 0:
            raise ValueError("n_blocks must be positive")
        self.n_blocks = n_blocks
        self.refcount = [0] * n_blocks
        self._free: deque[int] = deque(range(n_blocks))

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.n_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks with refcount 1; ``CacheFull`` (nothing taken) if short."""
        if n > len(self._free):
            raise CacheFull(f"need {n} free blocks, {len(self._free)} of {self.n_blocks} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self.refcount[b] = 1
        return blocks

    def share(self, block: int) -> None:
        if self.refcount[block] <= 0:
            raise IntegrityError(f"sharing free block {block}")
        self.refcount[block] += 1

    def release(self, block: int) -> None:
        if self.refcount[block] <= 0:
            raise IntegrityError(f"releasing free block {block}")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self._free.appendleft(block)

    def check(self, references: dict[int, int]) -> None:
        """Verify against ``references`` (block -> number of table entries naming it)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise IntegrityError("a block is on the free list twice")
        for b in range(self.n_blocks):
            want = references.get(b, 0)
            if self.refcount[b] != want:
                raise IntegrityError(f"block {b}: refcount {self.refcount[b]}, referenced {want}")
            if (want == 0) != (b in free):
                raise IntegrityError(f"block {b}: refcount {want} but free={b in free}")
        if len(free) + sum(1 for r in self.refcount if r > 0) != self.n_blocks:
            raise IntegrityError("free + used != total")
