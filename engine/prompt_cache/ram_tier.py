"""The host-RAM prompt cache (llama-server's ``--cache-ram``): states of slots that were
taken for other prompts, kept by their tokens, so that a later prompt starting the same
way restores one instead of recomputing its history. It acts as extra, idle slots: a
new request restores the entry sharing the longest prefix with its prompt when that
beats what the slots themselves hold (engine/scheduling/task_board.py decides).

Engine thread only (the scheduler's turn), except the counters, which monitoring reads
racily. Entries are ``SeqState`` copies (memory.save_seq): layout-independent, so an
entry saved from one slot restores into any other; memory validates it on restore.
With a disk tier (engine/prompt_cache/disk_tier.py), what the RAM limits evict (or
what RAM cannot hold) is written there, and a prompt restores from whichever tier
shares the longest prefix with it.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Protocol

from engine.prompt_cache.disk_tier import DiskEntry, DiskTier
from memory import CacheFull, Memory, SeqState, StateMismatch

log = logging.getLogger("slotserve.scheduler")

MIB = 1024 * 1024


class Slot(Protocol):
    """What the prompt cache reads and sets on a slot (engine/scheduling/slots.py's ``Slot``)."""

    id: int
    cached: list[int]  # the tokens its memory holds
    restored: tuple[str, int] | None  # set on a restore: tier, tokens

    @property
    def busy(self) -> bool: ...


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists, by bisection over slice
    comparisons (each in C): ~log2(n) list compares instead of n Python steps."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def state_bytes(state: SeqState) -> int:
    tensors = [state.positions, *state.tensors.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(eq=False)
class CacheEntry:
    tokens: list[int]  # one per position the state holds, from 0
    state: SeqState
    nbytes: int
    last_used: int = 0


@dataclass
class CacheCounters:
    hits: int = 0  # requests that restored an entry
    misses: int = 0  # requests that looked and found nothing better than the slots
    tokens_restored: int = 0
    saves: int = 0
    evictions: int = 0  # entries dropped for room (least recently used first)


@dataclass
class PromptCache:
    """``limit_bytes``: None for no limit, 0 for off (llama-server's ``--cache-ram``
    -1 and 0); ``limit_tokens``: most tokens held over all entries, None for no limit.
    As llama-server's, the token limit (the context size there) grows to what the byte
    limit holds at the entries' mean bytes per token, so with a byte limit the bytes
    decide."""

    limit_bytes: int | None
    limit_tokens: int | None = None
    disk: DiskTier | None = None
    entries: list[CacheEntry] = field(default_factory=list)
    counters: CacheCounters = field(default_factory=CacheCounters)
    close_timeout: float = 10.0  # seconds the disk tier gets at shutdown

    def __post_init__(self) -> None:
        self._clock = itertools.count(1)

    @classmethod
    def from_mib(cls, cache_ram_mib: int, limit_tokens: int | None = None, disk: DiskTier | None = None) -> PromptCache:
        if cache_ram_mib < -1:
            raise ValueError(f"--cache-ram must be -1 (no limit), 0 (off) or a size in MiB, got {cache_ram_mib}")
        return cls(None if cache_ram_mib == -1 else cache_ram_mib * MIB, limit_tokens, disk)

    @property
    def enabled(self) -> bool:
        return self.limit_bytes != 0 or self.disk is not None

    @property
    def n_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def _fits(self, nbytes: int, n_tokens: int) -> bool:
        if self.limit_bytes is not None and nbytes > self.limit_bytes:
            return False
        if self.limit_tokens is None:
            return True
        limit = self.limit_tokens
        if self.limit_bytes is not None and n_tokens:
            limit = max(limit, self.limit_bytes // max(1, nbytes // n_tokens))
        return n_tokens <= limit

    def put(self, tokens: list[int], state: SeqState) -> bool:
        """Keep ``state`` (for ``tokens``) unless an entry already covers it; entries it
        covers (their tokens a prefix of these) go. Evicts least recently used entries
        until the limits hold; a state alone over a limit is not kept. Returns whether
        it was stored."""
        if not self.enabled or not tokens:
            return False
        for entry in self.entries:
            if len(entry.tokens) >= len(tokens) and entry.tokens[: len(tokens)] == tokens:
                entry.last_used = next(self._clock)  # already held (as this, or more)
                return False
        nbytes = state_bytes(state)
        if self.limit_bytes == 0 or not self._fits(nbytes, len(tokens)):
            return self.disk is not None and self.disk.put(tokens, state)  # past RAM: straight to disk
        self.entries = [e for e in self.entries if e.tokens != tokens[: len(e.tokens)]]
        self.entries.append(CacheEntry(list(tokens), state, nbytes, next(self._clock)))
        self.counters.saves += 1
        self._evict()
        return True

    def _evict(self) -> None:
        while self.entries and not self._fits(self.n_bytes, self.n_tokens):
            oldest = min(self.entries, key=lambda e: e.last_used)
            self.entries.remove(oldest)
            self.counters.evictions += 1
            if self.disk is not None:
                self.disk.put(oldest.tokens, oldest.state)

    def best(self, prompt: list[int]) -> tuple[CacheEntry | DiskEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and that length, RAM's
        where the tiers tie."""
        best, n_best = None, 0
        for entry in self.entries:
            n = shared_prefix(entry.tokens, prompt)
            if n > n_best:
                best, n_best = entry, n
        if self.disk is not None:
            on_disk, n = self.disk.best(prompt, shared_prefix)
            if n > n_best:
                best, n_best = on_disk, n
        return best, n_best

    def ready(self, prompt: list[int], n_have: int, cuts_anywhere: bool) -> bool:
        """Whether ``prompt`` may be admitted now: False while the disk entry it would
        restore (one beating RAM and ``n_have``, what the slots offer) is being read by
        the disk tier's reader thread, which wakes the scheduler when done."""
        if self.disk is None:
            return True
        entry, n = self.best(prompt)
        if not isinstance(entry, DiskEntry) or n <= n_have or (n < len(entry.tokens) and not cuts_anywhere):
            return True
        return self.disk.prefetch(entry)

    def restored(self, entry: CacheEntry | DiskEntry, n_tokens: int) -> None:
        if isinstance(entry, CacheEntry):
            entry.last_used = next(self._clock)
        self.counters.hits += 1
        self.counters.tokens_restored += n_tokens

    def missed(self) -> None:
        self.counters.misses += 1

    def report(self) -> dict:
        """What /props, /slots and /metrics show (a racy read from another thread)."""
        entries, c = list(self.entries), self.counters
        return {
            "enabled": self.enabled,
            "limit_bytes": self.limit_bytes,
            "limit_tokens": self.limit_tokens,
            "n_entries": len(entries),
            "n_bytes": sum(e.nbytes for e in entries),
            "n_tokens": sum(len(e.tokens) for e in entries),
            "hits": c.hits,
            "misses": c.misses,
            "tokens_restored": c.tokens_restored,
            "saves": c.saves,
            "evictions": c.evictions,
            "disk": self.disk.report() if self.disk is not None else None,
        }

    # ---- slots in and out (engine thread, between steps) ---------------------------

    def save_slot(self, memory: Memory, slot: Slot) -> None:
        """An idle slot's state into the cache (a copy), when memory holds exactly its
        cached tokens; a failure to save loses nothing but the cache entry."""
        if not self.enabled or slot.busy or not slot.cached:
            return
        if memory.seq_pos_max(slot.id) + 1 != len(slot.cached):
            return
        try:
            self.put(slot.cached, memory.save_seq(slot.id))
        except Exception:  # noqa: BLE001 (a cache entry is an optimization: never fail the request for it)
            log.exception("saving slot %d to the prompt cache failed", slot.id)

    def restore_into(self, memory: Memory, slot: Slot, prompt: list[int], n_slots: int) -> int | None:
        """Restore the entry sharing the longest prefix with ``prompt`` into ``slot``
        when it beats ``n_slots`` (what the slots offer). A memory that cannot cut
        anywhere (recurrent states, sliding windows) restores an entry only where it
        ends: the prompt must extend the entry's tokens whole. Returns the tokens the
        slot holds then, or None when the cache offers nothing better (slot unchanged)."""
        if not self.enabled or not prompt:
            return None
        entry, n = self.best(prompt)
        if entry is not None and n < len(entry.tokens) and not memory.cuts_anywhere:
            n = 0  # would have to cut inside the entry: this kind cannot, in general
        if entry is None or n <= n_slots:
            self.missed()
            return None
        state = entry.state if isinstance(entry, CacheEntry) else self.disk.load(entry)
        if state is None:  # a disk entry that is gone or failed its checks (logged)
            self.missed()
            return None
        try:
            memory.load_seq(slot.id, state)  # all or nothing
        except (CacheFull, StateMismatch) as exc:
            log.info("prompt cache entry of %d tokens not restored into slot %d: %s", len(entry.tokens), slot.id, exc)
            if isinstance(exc, StateMismatch) and isinstance(entry, DiskEntry):
                self.disk.skip(entry, str(exc))  # it will never fit this server (e.g. another -ctk)
            self.missed()
            return None
        cut = memory.seq_cut_point(slot.id, n)
        if cut < len(entry.tokens) and not memory.seq_rm(slot.id, cut):
            cut = 0  # cannot cut there after all: start over
            memory.seq_rm(slot.id)
        slot.cached = prompt[:cut]
        if cut == 0:  # the slot's own content is gone too: nothing is reused
            self.missed()
        else:
            self.restored(entry, cut)
            slot.restored = ("ram" if isinstance(entry, CacheEntry) else "disk", cut)
        return cut

    def close(self, memory: Memory, idle: list[Slot], timeout: float | None = None) -> None:
        """At shutdown, with a disk tier: the idle slots' states and the RAM entries go
        to disk (newest first, as the writer keeps up within ``timeout`` s: what is not
        written is said in one log line), so that a restarted server finds them; then
        the tier's threads stop."""
        if self.disk is None:
            return
        for slot in idle:
            self.save_slot(memory, slot)
        newest_first = sorted(self.entries, key=lambda e: -e.last_used)
        self.disk.close([(e.tokens, e.state) for e in newest_first], self.close_timeout if timeout is None else timeout)

    def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        n, self.entries = len(self.entries), []
        return n
