"""The prompt cache's disk tier (``--cache-disk DIR``, ``--cache-disk-size MiB``): what
falls out of the host-RAM cache (engine/prompt_cache/ram_tier.py) is written here as
slot files (memory/files/slot_file.py: checksummed, fingerprinted) by a writer thread, so a
later prompt can restore it after the RAM entry is gone, after a restart, or on another
replica of the same model that shares the directory.

Files are named ``pc-<hash>.slot`` (hash of the model fingerprint and the tokens); no
other file of the directory is read, counted or removed, so the tier may share a
directory with saved slots. The index (tokens of each entry) is read from the files'
headers and token tensors, and refreshed from the directory every ``rescan_s``
seconds by the reader thread, so entries that other replicas write show up. Least recently used
goes first when the entries of this model pass the size cap: in this process's use order
(writes and hits), files it has not used before them by modification time, which a hit
also renews for other replicas. A file that is unreadable, corrupt or from another model is skipped
with one log line and not read again until it changes; it is never served. Names are
resolved inside the directory: a symbolic link, or a name that leads out, is no entry.

Threads: the engine thread never touches the disk. ``put`` hands a state to the
writer thread; ``prefetch`` asks the reader thread for an entry's state (the request
waits for it, not the engine: ``on_ready`` wakes the scheduler), and ``load`` takes
what was read. The reader thread also rescans. The index, the states read and the
counters are shared under one lock. ``close`` writes what it is given within a
deadline, then stops both threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from memory import SeqState
from memory.files.slot_dir import FileMissing, SlotDirectory
from memory.files.slot_file import SlotFileError, check_header, decode, encode, fingerprint_mismatch, fingerprint_of

log = logging.getLogger("slotserve.scheduler")

PREFIX, SUFFIX = "pc-", ".slot"
_QUEUE = 64  # states waiting for the writer; more are dropped (an optimization, never a stall)
_READ_KEPT = 8  # states read and not taken yet (their requests may have gone)
_STOP = None  # the threads' last item


@dataclass(eq=False)
class DiskEntry:
    filename: str
    tokens: list[int]
    size: int
    mtime_ns: int
    pending: SeqState | None = None  # not written yet: served from the writer's queue
    used: int = 0  # this process's use order (written or read); 0: found on disk, ordered by mtime


@dataclass
class DiskCounters:
    writes: int = 0  # entries written
    hits: int = 0  # entries read back into a slot
    skipped: int = 0  # files skipped: unreadable, corrupt, from another model
    evictions: int = 0  # entries removed for room (least recently used first)
    dropped: int = 0  # states not written: the writer was behind, or the write failed


@dataclass
class DiskTier:
    """``limit_bytes``: most bytes this model's entries take (None: no limit)."""

    root: Path
    limit_bytes: int | None
    fingerprint: dict[str, str]
    vocab_size: int
    n_ctx: int
    rescan_s: float = 1.0
    lowest: int = 0  # the lowest token id an entry may hold (below 0: images as keys, engine/core/media.py)
    counters: DiskCounters = field(default_factory=DiskCounters)
    on_ready: Callable[[], None] | None = None  # told (on the reader thread) when a prefetch is done

    def __post_init__(self) -> None:
        self.directory = SlotDirectory(self.root)
        self._lock = threading.Lock()
        self._entries: dict[str, DiskEntry] = {}
        self._skip: dict[str, tuple[int, int]] = {}  # file name -> (size, mtime) when skipped
        self._queue: queue.Queue = queue.Queue(_QUEUE)
        self._pending: dict[str, DiskEntry] = {}  # handed to the writer, not yet on disk
        self._reads: queue.Queue = queue.Queue()  # entries to read (reader thread)
        self._read: OrderedDict[str, SeqState | None] = OrderedDict()  # read, not taken (None: it failed)
        self._reading: set[str] = set()
        self._clock = itertools.count(1)  # use order (under the lock)
        self.rescan()
        self._writer = threading.Thread(target=self._write_loop, name="slotserve-cache-write", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="slotserve-cache-read", daemon=True)
        self._writer.start()
        self._reader.start()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + n)

    # ---- names and the index ----------------------------------------------------

    def name_for(self, tokens: list[int]) -> str:
        h = hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode())
        h.update(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes())
        return f"{PREFIX}{h.hexdigest()[:40]}{SUFFIX}"

    def rescan(self) -> None:
        """Bring the index in line with the directory (new files read, gone ones
        dropped; temporary files of writers that are gone removed). At start-up, then
        on the reader thread."""
        self.directory.sweep()
        try:
            found = {
                e.name: e.stat(follow_symlinks=False)
                for e in os.scandir(self.directory.root)
                if e.name.startswith(PREFIX) and e.name.endswith(SUFFIX) and e.is_file(follow_symlinks=False)
            }
        except OSError as exc:
            log.warning("prompt cache disk tier: cannot list %s: %s", self.directory.root, exc)
            return
        with self._lock:
            for name in [n for n in self._entries if n not in found]:
                del self._entries[name]
            known = {n: (e.size, e.mtime_ns) for n, e in self._entries.items()}
            skip = dict(self._skip)
        for name, st in found.items():
            stamp = (st.st_size, st.st_mtime_ns)
            if name in known or skip.get(name) == stamp:
                continue
            tokens = self._read_tokens(name)
            if tokens is None:
                with self._lock:
                    self._skip[name] = stamp
                continue
            with self._lock:
                self._entries[name] = DiskEntry(name, tokens, st.st_size, st.st_mtime_ns)

    def _read_tokens(self, name: str) -> list[int] | None:
        """The entry's tokens from its header and token tensor, or None (logged) when the
        file is not one this server may use."""
        try:
            with safe_open(self.directory.path(name), "pt") as f:
                meta = check_header(f.metadata())
                tokens = f.get_tensor("tokens")
        except Exception as exc:  # noqa: BLE001 (safetensors raises several types)
            return self._skipped(name, f"unreadable ({exc})")
        reason = fingerprint_mismatch(fingerprint_of(meta), self.fingerprint)
        if reason:
            return self._skipped(name, reason)
        if tokens.dtype != torch.int64 or tokens.dim() != 1 or str(tokens.numel()) != meta.get("n_tokens"):
            return self._skipped(name, "its tokens do not match its header")
        return tokens.tolist()

    def _skipped(self, name: str, why: str) -> None:
        self._count("skipped")
        log.warning("prompt cache disk tier: skipping %s: %s", name, why)
        return None

    def entries(self) -> list[DiskEntry]:
        with self._lock:
            return list(self._entries.values())

    # ---- engine thread ----------------------------------------------------------

    def best(self, prompt: list[int], shared_prefix) -> tuple[DiskEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and that length (the
        index as the reader thread last saw it; no disk access)."""
        with self._lock:
            candidates = [*self._entries.values(), *self._pending.values()]
        best, n_best = None, 0
        for entry in candidates:
            n = shared_prefix(entry.tokens, prompt)
            if n > n_best:
                best, n_best = entry, n
        return best, n_best

    def prefetch(self, entry: DiskEntry) -> bool:
        """Whether ``load(entry)`` can answer now; if not, the reader thread is asked
        to read it (``on_ready`` is called once it has)."""
        if entry.pending is not None:
            return True
        with self._lock:
            if entry.filename in self._read:
                return True
            if entry.filename in self._reading:
                return False
            self._reading.add(entry.filename)
        self._reads.put(entry)
        return False

    def load(self, entry: DiskEntry) -> SeqState | None:
        """The entry's state as the reader thread read and checked it (checksum, model,
        vocabulary, context), or None: not read yet (a prefetch is started), a file
        gone (another replica evicted it) or one that failed a check (skipped from now
        on, logged). A state still waiting for the writer is served as it is."""
        if entry.pending is not None:
            self._count("hits")
            return entry.pending
        with self._lock:
            if entry.filename not in self._read:
                ready = False
            else:
                ready, state = True, self._read.pop(entry.filename)
        if not ready:
            self.prefetch(entry)
            return None
        if state is not None:
            self._count("hits")
        return state

    def _load(self, entry: DiskEntry) -> SeqState | None:
        """Reader thread: the entry's file read and checked whole."""
        try:
            file = decode(self.directory.read(entry.filename))
        except (FileMissing, OSError) as exc:
            return self._drop(entry, str(exc), skip=False)
        except SlotFileError as exc:
            return self._drop(entry, str(exc), skip=True)
        reason = fingerprint_mismatch(file.fingerprint, self.fingerprint)
        if reason is None and file.tokens != entry.tokens:
            reason = "its tokens changed since the index read them"
        if reason is None and len(file.tokens) > self.n_ctx:
            reason = f"it holds {len(file.tokens)} tokens, more than a slot's context ({self.n_ctx})"
        if reason is None and file.tokens and (min(file.tokens) < self.lowest or max(file.tokens) >= self.vocab_size):
            reason = "it holds token ids outside the vocabulary"
        if reason:
            return self._drop(entry, reason, skip=True)
        try:  # renew its place in the LRU order (other replicas read the same clock)
            path = self.directory.path(entry.filename)
            os.utime(path, follow_symlinks=False)
            entry.mtime_ns = os.stat(path, follow_symlinks=False).st_mtime_ns
        except OSError:
            pass
        with self._lock:
            entry.used = next(self._clock)
        return file.state

    def skip(self, entry: DiskEntry, why: str) -> None:
        """Skip ``entry`` from now on (logged): memory refused its state."""
        self._drop(entry, why, skip=True)

    def _drop(self, entry: DiskEntry, why: str, skip: bool) -> None:
        """Out of the index; ``skip``: not read again until the file changes (its size
        and time as the index knows them: no disk access here)."""
        with self._lock:
            self._entries.pop(entry.filename, None)
            if skip:
                self._skip[entry.filename] = (entry.size, entry.mtime_ns)
        if not skip:  # gone: not a fault of the file
            log.info("prompt cache disk tier: %s is gone (%s)", entry.filename, why)
            return None
        return self._skipped(entry.filename, why)

    def put(self, tokens: list[int], state: SeqState, wait: float = 0.0) -> bool:
        """Hand a state to the writer thread (unless these tokens are on disk already);
        False when the writer stays behind for ``wait`` s (the state is dropped)."""
        name = self.name_for(tokens)
        with self._lock:
            if name in self._entries or name in self._pending:
                return True
            self._pending[name] = DiskEntry(name, list(tokens), 0, 0, pending=state)
        try:
            self._queue.put((name, list(tokens), state), block=wait > 0, timeout=wait if wait > 0 else None)
        except queue.Full:
            with self._lock:
                self._pending.pop(name, None)
            self._count("dropped")
            return False
        return True

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the writer to finish what it holds."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, states: list[tuple[list[int], SeqState]], timeout: float) -> None:
        """At shutdown: write ``states`` (in order) as the writer keeps up within
        ``timeout`` s, say in one log line what was not written, stop both threads."""
        deadline = time.monotonic() + timeout
        n_dropped = 0
        for tokens, state in states:
            if not self.put(tokens, state, wait=max(0.001, deadline - time.monotonic())):
                n_dropped += 1
        written = self.drain(max(0.0, deadline - time.monotonic()))
        if n_dropped or not written:
            log.warning(
                "prompt cache disk tier: shutdown wrote %d of %d entries in %.0f s; the rest are lost",
                len(states) - n_dropped - self._queue.unfinished_tasks,
                len(states),
                timeout,
            )
        self._reads.put(_STOP)
        if written:
            self._queue.put(_STOP)
            self._writer.join(timeout=max(0.0, deadline - time.monotonic()) + 1)
        self._reader.join(timeout=5)

    # ---- reader and writer threads ------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            try:
                entry = self._reads.get(timeout=self.rescan_s)
            except queue.Empty:
                self.rescan()
                continue
            if entry is _STOP:
                return
            try:
                state = self._load(entry)
            except Exception:  # noqa: BLE001 (a lost entry is a lost optimization)
                log.exception("prompt cache disk tier: reading %s failed", entry.filename)
                state = None
            with self._lock:
                self._reading.discard(entry.filename)
                self._read[entry.filename] = state
                while len(self._read) > _READ_KEPT:
                    self._read.popitem(last=False)
            if self.on_ready is not None:
                self.on_ready()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            name, tokens, state = item
            try:
                self._write(name, tokens, state)
            except Exception:  # noqa: BLE001 (a lost entry is a lost optimization)
                self._count("dropped")
                log.exception("prompt cache disk tier: writing an entry of %d tokens failed", len(tokens))
            finally:
                with self._lock:
                    self._pending.pop(name, None)
                self._queue.task_done()

    def _write(self, name: str, tokens: list[int], state: SeqState) -> None:
        data = encode(tokens, state, self.fingerprint)
        if self.limit_bytes is not None and len(data) > self.limit_bytes:
            self._count("dropped")
            return
        self.directory.write(name, data)
        st = os.stat(self.directory.path(name), follow_symlinks=False)
        with self._lock:
            self._entries[name] = DiskEntry(name, list(tokens), st.st_size, st.st_mtime_ns, used=next(self._clock))
            self.counters.writes += 1
        self._evict()

    def _evict(self) -> None:
        if self.limit_bytes is None:
            return
        pending = self.directory.tmp_bytes()  # writes in progress and orphans count against the cap too
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: (e.used, e.mtime_ns))
            total = sum(e.size for e in entries) + pending
            gone = []
            while entries and total > self.limit_bytes:
                oldest = entries.pop(0)
                total -= oldest.size
                gone.append(oldest)
                del self._entries[oldest.filename]
        for entry in gone:
            self.directory.path(entry.filename).unlink(missing_ok=True)
        self._count("evictions", len(gone))

    def report(self) -> dict:
        with self._lock:
            entries, c = list(self._entries.values()), dataclasses.replace(self.counters)
        return {
            "path": str(self.directory.root),
            "limit_bytes": self.limit_bytes,
            "n_entries": len(entries),
            "n_bytes": sum(e.size for e in entries),
            "n_tokens": sum(len(e.tokens) for e in entries),
            "writes": c.writes,
            "hits": c.hits,
            "skipped": c.skipped,
            "evictions": c.evictions,
            "dropped": c.dropped,
        }
