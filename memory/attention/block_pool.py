"""Reference-counted pool of fixed-size block ids (bookkeeping only, no tensors), with
blocks kept by the hash of their content (vLLM's automatic prefix caching).

A block may carry a hash (``publish``): the hash of its tokens and of every token
before it in its sequence. When its count falls to zero a hashed block is not freed
but kept (``n_cached``), still findable by its hash (``lookup``, ``take``), until an
allocation needs it: free blocks go first, then kept ones, least recently released
first. A hashed block never changes: writers copy it first (memory/attention/paged_kv.py).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from memory.protocol import CacheFull, IntegrityError


class BlockPool:
    """A free list plus a reference count per block, and the kept (hashed, unreferenced) blocks.

    ``allocate`` is all-or-nothing; ``release`` returns a block to the free list when
    its count reaches zero (or keeps it, if hashed). Blocks are handed out
    lowest-id-first after a reset, then in release order (recently freed blocks are
    reused first: they are warm in cache).
    """

    def __init__(self, n_blocks: int):
        if n_blocks <= 0:
            raise ValueError("n_blocks must be positive")
        self.n_blocks = n_blocks
        self.refcount = [0] * n_blocks
        self._free: deque[int] = deque(range(n_blocks))
        self._kept: OrderedDict[int, None] = OrderedDict()  # refcount 0 and hashed, oldest first
        self.hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}

    @property
    def n_free(self) -> int:
        """Blocks an allocation may take: free ones and kept ones."""
        return len(self._free) + len(self._kept)

    @property
    def n_used(self) -> int:
        return self.n_blocks - self.n_free

    @property
    def n_cached(self) -> int:
        """Kept blocks: referenced by no sequence, findable by their hash."""
        return len(self._kept)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks with refcount 1, free ones first, then the least recently
        kept (their hashes dropped); ``CacheFull`` (nothing taken) if short."""
        if n > self.n_free:
            raise CacheFull(f"need {n} free blocks, {self.n_free} of {self.n_blocks} free")
        blocks = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        while len(blocks) < n:
            b, _ = self._kept.popitem(last=False)
            self._forget(b)
            blocks.append(b)
        for b in blocks:
            self.refcount[b] = 1
        return blocks

    # ---- hashes -----------------------------------------------------------------

    def publish(self, block: int, h: bytes) -> None:
        """``block`` (referenced) holds the content ``h`` names; a hash another block
        already has keeps that block."""
        if self.refcount[block] <= 0:
            raise IntegrityError(f"publishing free block {block}")
        if block in self.hash_of or h in self._by_hash:
            return
        self.hash_of[block], self._by_hash[h] = h, block

    def lookup(self, h: bytes) -> int | None:
        return self._by_hash.get(h)

    def take(self, block: int) -> None:
        """One more reference to a hashed block, kept or referenced."""
        if block in self._kept:
            del self._kept[block]
        self.refcount[block] += 1

    def _forget(self, block: int) -> None:
        del self._by_hash[self.hash_of.pop(block)]

    def share(self, block: int) -> None:
        if self.refcount[block] <= 0:
            raise IntegrityError(f"sharing free block {block}")
        self.refcount[block] += 1

    def release(self, block: int) -> None:
        if self.refcount[block] <= 0:
            raise IntegrityError(f"releasing free block {block}")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            if block in self.hash_of:
                self._kept[block] = None  # newest at the end
            else:
                self._free.appendleft(block)

    def check(self, references: dict[int, int]) -> None:
        """Verify against ``references`` (block -> number of table entries naming it)."""
        free, kept = set(self._free), set(self._kept)
        if len(free) != len(self._free):
            raise IntegrityError("a block is on the free list twice")
        if free & kept:
            raise IntegrityError("a block is both free and kept")
        for b in range(self.n_blocks):
            want = references.get(b, 0)
            if self.refcount[b] != want:
                raise IntegrityError(f"block {b}: refcount {self.refcount[b]}, referenced {want}")
            if (want == 0) != (b in free or b in kept):
                raise IntegrityError(f"block {b}: refcount {want} but free={b in free}, kept={b in kept}")
            if b in kept and b not in self.hash_of:
                raise IntegrityError(f"block {b} is kept without a hash")
        if any(self._by_hash.get(h) != b for b, h in self.hash_of.items()) or len(self._by_hash) != len(self.hash_of):
            raise IntegrityError("the hash index disagrees with the blocks' hashes")
        if len(free) + len(kept) + sum(1 for r in self.refcount if r > 0) != self.n_blocks:
            raise IntegrityError("free + kept + used != total")
