"""The host-RAM prompt cache on its own: what it keeps, what it drops, what it finds."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from waiting import wait_for

from engine.prompt_cache.disk_tier import DiskTier
from engine.prompt_cache.ram_tier import MIB, PromptCache, shared_prefix, state_bytes
from memory import SeqState


def state(n: int, width: int = 256) -> SeqState:
    """A state of ``n`` positions, 4 * width * n bytes of tensor plus 8 * n of positions."""
    return SeqState(torch.arange(n), {"k.0": torch.zeros(n, width)})


def test_shared_prefix_is_the_common_prefix():
    assert shared_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
    assert shared_prefix([5] * 1000 + [1], [5] * 1000 + [2]) == 1000
    assert shared_prefix([7], [8]) == 0


def test_the_entry_with_the_longest_shared_prefix_is_found():
    cache = PromptCache(None)
    cache.put([1, 2, 3, 4, 5], state(5))
    cache.put([1, 2, 7, 8], state(4))
    entry, n = cache.best([1, 2, 7, 8, 9, 10])
    assert entry.tokens == [1, 2, 7, 8] and n == 4
    entry, n = cache.best([1, 2, 3, 0])
    assert entry.tokens == [1, 2, 3, 4, 5] and n == 3
    assert cache.best([9, 9]) == (None, 0)


def test_an_entry_another_covers_is_not_kept_twice():
    cache = PromptCache(None)
    assert cache.put([1, 2, 3], state(3))
    assert cache.put([1, 2, 3, 4, 5], state(5))  # extends the first: replaces it
    assert [e.tokens for e in cache.entries] == [[1, 2, 3, 4, 5]]
    assert not cache.put([1, 2, 3], state(3))  # covered by the longer one
    assert not cache.put([1, 2, 3, 4, 5], state(5))
    assert len(cache.entries) == 1 and cache.counters.saves == 2


def test_least_recently_used_entries_go_first_and_bytes_never_exceed_the_cap():
    one = state_bytes(state(10))
    cache = PromptCache(3 * one)
    for i in range(3):
        cache.put([i] * 10, state(10))
    cache.best([0] * 10)
    cache.restored(cache.entries[0], 10)  # entry 0 used: entry 1 is now the oldest
    cache.put([3] * 10, state(10))
    assert sorted(e.tokens[0] for e in cache.entries) == [0, 2, 3]
    assert cache.counters.evictions == 1 and cache.n_bytes <= 3 * one
    assert not cache.put([4] * 40, state(40))  # alone over the cap: not kept, nothing evicted
    assert len(cache.entries) == 3 and cache.n_bytes <= 3 * one


def test_the_token_limit_bounds_the_entries_too():
    cache = PromptCache(None, limit_tokens=25)
    cache.put([1] * 10, state(10))
    cache.put([2] * 10, state(10))
    cache.put([3] * 10, state(10))
    assert cache.n_tokens <= 25 and [e.tokens[0] for e in cache.entries] == [2, 3]


def test_with_a_byte_limit_the_token_limit_grows_to_what_the_bytes_hold():
    """llama-server's rule: a context-sized token limit does not cap a cache whose
    byte limit holds more (32 conversations of 600 tokens on a 2,048-token context)."""
    one = state_bytes(state(10))
    cache = PromptCache(100 * one, limit_tokens=25)
    for i in range(8):
        cache.put([i] * 10, state(10))
    assert len(cache.entries) == 8 and cache.counters.evictions == 0
    small = PromptCache(3 * one, limit_tokens=25)
    for i in range(8):
        small.put([i] * 10, state(10))
    assert len(small.entries) == 3 and small.n_tokens == 30  # raised from 25 to the 30 tokens the bytes hold


def test_cache_ram_follows_llama_servers_values():
    assert PromptCache.from_mib(-1).limit_bytes is None
    assert PromptCache.from_mib(8192).limit_bytes == 8192 * MIB
    off = PromptCache.from_mib(0)
    assert not off.enabled and not off.put([1], state(1)) and off.entries == []
    with pytest.raises(ValueError, match="cache-ram"):
        PromptCache.from_mib(-2)


# ---- the disk tier --------------------------------------------------------------

FP = {"architecture": "Test", "weights_sha256": "abc"}


def disk(path, limit_bytes=None, **kw) -> DiskTier:
    """A tier whose reader thread does not rescan by itself: the tests call ``rescan``."""
    return DiskTier(path, limit_bytes, FP, vocab_size=100, n_ctx=64, **{"rescan_s": 3600, **kw})


def loaded(tier: DiskTier, entry):
    """The entry's state as the reader thread reads it (load answers once prefetched)."""
    wait_for(lambda: tier.prefetch(entry), what="the reader thread's read")
    return tier.load(entry)


def test_what_ram_evicts_goes_to_disk_and_comes_back_from_either_tier(tmp_path):
    tier = disk(tmp_path)
    cache = PromptCache(state_bytes(state(10)), disk=tier)
    cache.put([1] * 10, state(10))
    cache.put([2] * 10, state(10))  # evicts [1] * 10 to the disk tier
    assert [e.tokens for e in cache.entries] == [[2] * 10]
    entry, n = cache.best([1] * 10 + [5])
    assert n == 10 and entry.tokens == [1] * 10  # found while pending or after the write
    assert tier.drain(10) and len(list(tmp_path.glob("pc-*.slot"))) == 1
    entry, n = cache.best([1] * 10 + [5])
    assert entry.pending is None and torch.equal(loaded(tier, entry).positions, torch.arange(10))
    assert tier.counters.hits == 1 and tier.counters.writes == 1
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in tmp_path.glob("pc-*.slot"))  # prompts' ids: owner only


def test_the_disk_cap_holds_and_the_least_recently_used_file_goes(tmp_path):
    tier = disk(tmp_path)
    tier.put([1] * 10, state(10))
    assert tier.drain(10)
    size = tier.report()["n_bytes"]
    tier = disk(tmp_path, limit_bytes=int(2.5 * size))  # a restarted server finds the first file
    assert [e.tokens for e in tier.entries()] == [[1] * 10]
    for i in (2, 3):
        tier.put([i] * 10, state(10))
        assert tier.drain(10)
    on_disk = lambda: sum(f.stat().st_size for f in tmp_path.glob("pc-*.slot"))  # noqa: E731
    assert on_disk() <= 2.5 * size and tier.counters.evictions == 1
    assert sorted(e.tokens[0] for e in tier.entries()) == [2, 3]
    loaded(tier, tier.best([2] * 10, shared_prefix)[0])  # a hit renews [2] * 10: [3] * 10 goes next
    tier.put([4] * 10, state(10))
    assert tier.drain(10) and sorted(e.tokens[0] for e in tier.entries()) == [2, 4]
    assert on_disk() <= 2.5 * size


def test_entries_another_replica_writes_are_found_and_foreign_or_bad_files_skipped(tmp_path, caplog):
    ours, other = disk(tmp_path), disk(tmp_path)
    other.put([7] * 12, state(12))
    assert other.drain(10)
    ours.rescan()
    entry, n = ours.best([7] * 12, shared_prefix)
    assert n == 12 and loaded(ours, entry) is not None
    (tmp_path / "pc-junk.slot").write_bytes(b"not a slot file")
    foreign = DiskTier(tmp_path, None, {**FP, "weights_sha256": "other"}, 100, 64)
    foreign.put([8] * 12, state(12))
    assert foreign.drain(10)
    (tmp_path / "saved-by-a-user.bin").write_bytes(b"left alone")
    caplog.clear()  # (the foreign tier logged ours and the junk as it started)
    with caplog.at_level(logging.WARNING, logger="slotserve.scheduler"):
        ours.rescan()
        assert ours.best([8] * 12, shared_prefix) == (None, 0)
    assert ours.counters.skipped == 2 and len(caplog.records) == 2
    ours.rescan()  # not read (nor logged) again while unchanged
    assert ours.counters.skipped == 2 and (tmp_path / "saved-by-a-user.bin").exists()


def test_the_caller_never_touches_the_disk(tmp_path, monkeypatch):
    """best, prefetch and load (the engine thread's calls) list and read nothing: the
    reader thread does (issue 37: the engine thread used to rescan and read files)."""
    import engine.prompt_cache.disk_tier as disk_tier
    from memory.files.slot_dir import SlotDirectory

    seen: list[str] = []
    real_scandir, real_read = disk_tier.os.scandir, SlotDirectory.read

    def scandir(*a):
        seen.append(threading.current_thread().name)
        return real_scandir(*a)

    def read(self, *a, **kw):
        seen.append(threading.current_thread().name)
        return real_read(self, *a, **kw)

    tier = disk(tmp_path, rescan_s=0.05)
    tier.put([1] * 10, state(10))
    assert tier.drain(10)
    monkeypatch.setattr(disk_tier.os, "scandir", scandir)
    monkeypatch.setattr(SlotDirectory, "read", read)
    wait_for(lambda: seen, what="a rescan by the reader thread")
    entry, n = tier.best([1] * 10 + [2], shared_prefix)
    assert n == 10 and tier.load(entry) is None  # not read yet: a prefetch starts, nothing waits
    assert torch.equal(loaded(tier, entry).positions, torch.arange(10))
    assert set(seen) == {"slotserve-cache-read"}, seen


def test_a_link_out_of_the_folder_is_no_entry(tmp_path):
    outside, inside = tmp_path / "outside", tmp_path / "cache"
    other = disk(outside)
    other.put([5] * 10, state(10))
    assert other.drain(10)
    (target,) = outside.glob("pc-*.slot")
    (inside / target.name).parent.mkdir(exist_ok=True)
    (inside / target.name).symlink_to(target)
    tier = disk(inside)
    assert tier.best([5] * 10, shared_prefix) == (None, 0) and tier.entries() == []


def test_shutdown_writes_every_ram_entry_then_stops_its_threads(tmp_path):
    """More entries than the writer's queue holds (64): all reach the disk within the
    time given, and the tier's threads end."""
    tier = disk(tmp_path)
    cache = PromptCache(None, disk=tier)
    for i in range(100):
        cache.put([i + 1] * 3 + [0], state(4, width=8))
    cache.close(memory=None, idle=[], timeout=60)
    assert len(list(tmp_path.glob("pc-*.slot"))) == 100 and tier.counters.dropped == 0
    wait_for(lambda: not tier._reader.is_alive() and not tier._writer.is_alive(), what="the tier's threads to end")


def test_shutdown_says_in_one_line_what_it_could_not_write(tmp_path, monkeypatch, caplog):
    tier = disk(tmp_path)
    release = threading.Event()
    real_write = tier._write
    monkeypatch.setattr(tier, "_write", lambda *a: (release.wait(30), real_write(*a)))  # a writer that is stuck
    cache = PromptCache(None, disk=tier)
    for i in range(80):
        cache.put([i + 1] * 3 + [0], state(4, width=8))
    with caplog.at_level(logging.WARNING, logger="slotserve.scheduler"):
        cache.close(memory=None, idle=[], timeout=0.2)
    release.set()
    lines = [r.getMessage() for r in caplog.records if "shutdown wrote" in r.getMessage()]
    assert len(lines) == 1 and "of 80 entries" in lines[0], lines


def test_a_writer_killed_mid_write_leaves_nothing_that_lasts_or_goes_uncounted(tmp_path):
    """A process killed while writing an entry leaves its temporary file: the next
    start (and each rescan) removes it; a temporary file of a live writer is kept but
    counted against --cache-disk-size; an old one from another host goes after STALE_S."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from memory.files.slot_dir import STALE_S

    writer = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from memory.files.slot_dir import SlotDirectory\n"
            "SlotDirectory(sys.argv[1]).write('pc-x.slot', bytes(40 << 20), lambda d, t: time.sleep(60))\n"
        ), str(tmp_path)],
    )  # fmt: skip
    wait_for(lambda: list(tmp_path.glob(".slotserve-*.tmp")), 60, "the writer's temporary file")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    (orphan,) = tmp_path.glob(".slotserve-*.tmp")
    live = tmp_path / f".slotserve-{orphan.name.split('-')[1]}-{os.getpid()}-00.tmp"  # this process: alive
    live.write_bytes(b"")
    foreign = tmp_path / ".slotserve-otherhost-1-00.tmp"
    foreign.write_bytes(bytes(10))
    tier = disk(tmp_path)
    assert not orphan.exists() and live.exists() and foreign.exists()
    old = time.time() - STALE_S - 60
    os.utime(foreign, (old, old))
    tier.rescan()
    assert not foreign.exists() and live.exists()
    tier.put([1] * 10, state(10))
    assert tier.drain(10)
    size = tier.report()["n_bytes"]
    live.write_bytes(bytes(size // 2))  # a write in progress: half an entry
    capped = disk(tmp_path, limit_bytes=2 * size)  # two entries fit; with the write in progress, one
    capped.put([2] * 10, state(10))
    assert capped.drain(10) and capped.counters.evictions == 1
    assert sum(e.size for e in capped.entries()) + size // 2 <= 2 * size
