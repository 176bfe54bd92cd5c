"""The prompt cache's disk tier (``--cache-disk DIR``, ``--cache-disk-size MiB``): what
falls out of the host-RAM cache (engine/prompt_cache/ram_tier.py) is written here as
slot files (memory/files/slot_file.py: checksummed, fingerprinted) by a writer thread, so a
later prompt can restore it after the RAM entry is gone, after a restart, or on another
replica of the same model that shares the directory.

Files are named ``pc-<hash>.slot`` (hash of the model fingerprint and the tokens); no
other file of the directory is read, counted or removed, so the tier may share a
directory with saved slots. The index (tokens of each entry) is read from the files'
headers and token tensors, and refreshed from the directory at most every
``rescan_s`` seconds, so entries that other replicas write show up. Least recently used
(by modification time, which a hit renews) goes first when the entries of this model
pass the size cap. A file that is unreadable, corrupt or from another model is skipped
with one log line and not read again until it changes; it is never served.

Thread use: ``put`` from the engine thread hands the state to the writer thread;
``best`` and ``load`` run on the engine thread; the index is shared under a lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
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


@dataclass(eq=False)
class DiskEntry:
    filename: str
    tokens: list[int]
    size: int
    mtime_ns: int
    pending: SeqState | None = None  # not written yet: served from the writer's queue


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
    counters: DiskCounters = field(default_factory=DiskCounters)

    def __post_init__(self) -> None:
        self.directory = SlotDirectory(self.root)
        self._lock = threading.Lock()
        self._entries: dict[str, DiskEntry] = {}
        self._skip: dict[str, tuple[int, int]] = {}  # file name -> (size, mtime) when skipped
        self._scanned = 0.0
        self._queue: queue.Queue = queue.Queue(_QUEUE)
        self._pending: dict[str, DiskEntry] = {}  # handed to the writer, not yet on disk
        self._writer = threading.Thread(target=self._write_loop, name="slotserve-cache-disk", daemon=True)
        self._writer.start()
        self.rescan(force=True)

    # ---- names and the index ----------------------------------------------------

    def name_for(self, tokens: list[int]) -> str:
        h = hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode())
        h.update(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes())
        return f"{PREFIX}{h.hexdigest()[:40]}{SUFFIX}"

    def rescan(self, force: bool = False) -> None:
        """Bring the index in line with the directory (new files read, gone ones dropped)."""
        now = time.monotonic()
        if not force and now - self._scanned < self.rescan_s:
            return
        self._scanned = now
        try:
            found = {
                e.name: e.stat()
                for e in os.scandir(self.directory.root)
                if e.name.startswith(PREFIX) and e.name.endswith(SUFFIX) and e.is_file()
            }
        except OSError as exc:
            log.warning("prompt cache disk tier: cannot list %s: %s", self.directory.root, exc)
            return
        with self._lock:
            for name in [n for n in self._entries if n not in found]:
                del self._entries[name]
            known = {n: (e.size, e.mtime_ns) for n, e in self._entries.items()}
        for name, st in found.items():
            stamp = (st.st_size, st.st_mtime_ns)
            if name in known or self._skip.get(name) == stamp:
                continue
            tokens = self._read_tokens(name)
            if tokens is None:
                self._skip[name] = stamp
                continue
            with self._lock:
                self._entries[name] = DiskEntry(name, tokens, st.st_size, st.st_mtime_ns)

    def _read_tokens(self, name: str) -> list[int] | None:
        """The entry's tokens from its header and token tensor, or None (logged) when the
        file is not one this server may use."""
        path = self.directory.root / name
        try:
            with safe_open(path, "pt") as f:
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
        self.counters.skipped += 1
        log.warning("prompt cache disk tier: skipping %s: %s", name, why)
        return None

    def entries(self) -> list[DiskEntry]:
        with self._lock:
            return list(self._entries.values())

    # ---- engine thread ----------------------------------------------------------

    def best(self, prompt: list[int], shared_prefix) -> tuple[DiskEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and that length."""
        self.rescan()
        with self._lock:
            pending = list(self._pending.values())
        best, n_best = None, 0
        for entry in [*self.entries(), *pending]:
            n = shared_prefix(entry.tokens, prompt)
            if n > n_best:
                best, n_best = entry, n
        return best, n_best

    def load(self, entry: DiskEntry) -> SeqState | None:
        """The entry's state, checked whole (checksum, model, vocabulary, context), or
        None: a file gone (another replica evicted it) or one that fails a check, which
        is skipped from now on with a log line. A state still waiting for the writer is
        served as it is."""
        if entry.pending is not None:
            self.counters.hits += 1
            return entry.pending
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
        if reason is None and file.tokens and (min(file.tokens) < 0 or max(file.tokens) >= self.vocab_size):
            reason = "it holds token ids outside the vocabulary"
        if reason:
            return self._drop(entry, reason, skip=True)
        self.counters.hits += 1
        try:  # renew its place in the LRU order (other replicas read the same clock)
            path = self.directory.root / entry.filename
            os.utime(path)
            entry.mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            pass
        return file.state

    def skip(self, entry: DiskEntry, why: str) -> None:
        """Skip ``entry`` from now on (logged): memory refused its state."""
        self._drop(entry, why, skip=True)

    def _drop(self, entry: DiskEntry, why: str, skip: bool) -> None:
        with self._lock:
            self._entries.pop(entry.filename, None)
        if not skip:  # gone: not a fault of the file
            log.info("prompt cache disk tier: %s is gone (%s)", entry.filename, why)
            return None
        try:
            st = os.stat(self.directory.root / entry.filename)
            self._skip[entry.filename] = (st.st_size, st.st_mtime_ns)
        except OSError:
            pass
        return self._skipped(entry.filename, why)

    def put(self, tokens: list[int], state: SeqState) -> bool:
        """Hand a state to the writer thread (unless these tokens are on disk already);
        False when the writer is behind (the state is dropped)."""
        name = self.name_for(tokens)
        with self._lock:
            if name in self._entries or name in self._pending:
                return True
            try:
                self._queue.put_nowait((name, list(tokens), state))
            except queue.Full:
                self.counters.dropped += 1
                return False
            self._pending[name] = DiskEntry(name, list(tokens), 0, 0, pending=state)
            return True

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the writer to finish what it holds."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    # ---- writer thread ----------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            name, tokens, state = self._queue.get()
            try:
                self._write(name, tokens, state)
            except Exception:  # noqa: BLE001 (a lost entry is a lost optimization)
                self.counters.dropped += 1
                log.exception("prompt cache disk tier: writing an entry of %d tokens failed", len(tokens))
            finally:
                with self._lock:
                    self._pending.pop(name, None)
                self._queue.task_done()

    def _write(self, name: str, tokens: list[int], state: SeqState) -> None:
        data = encode(tokens, state, self.fingerprint)
        if self.limit_bytes is not None and len(data) > self.limit_bytes:
            self.counters.dropped += 1
            return
        self.directory.write(name, data)
        st = os.stat(self.directory.root / name)
        with self._lock:
            self._entries[name] = DiskEntry(name, list(tokens), st.st_size, st.st_mtime_ns)
        self._skip.pop(name, None)
        self.counters.writes += 1
        self._evict()

    def _evict(self) -> None:
        if self.limit_bytes is None:
            return
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: e.mtime_ns)
            total = sum(e.size for e in entries)
            gone = []
            while entries and total > self.limit_bytes:
                oldest = entries.pop(0)
                total -= oldest.size
                gone.append(oldest)
                del self._entries[oldest.filename]
        for entry in gone:
            (self.directory.root / entry.filename).unlink(missing_ok=True)
            self.counters.evictions += 1

    def report(self) -> dict:
        entries, c = self.entries(), self.counters
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
