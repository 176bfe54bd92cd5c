"""The host-RAM prompt cache through a real server: more conversations than slots, and
each follow-up turn restores its history from host RAM instead of recomputing it, with
the same tokens as a cold run; for a Llama (both KV layouts), a sliding-window model
and a hybrid (restored only at a position the state holds exactly)."""

from __future__ import annotations

import httpx
import pytest
from checkpoints import GRANITE_HYBRID_TINY, make_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from server_proc import InProcessServer, ServerProcess
from waiting import wait_for

N_SLOTS, N_CONVERSATIONS, N_NEW = 2, 4, 8


def complete(srv, prompt: list[int], **kw) -> dict:
    body = {"prompt": prompt, "n_predict": N_NEW, "temperature": 0, "ignore_eos": True, **kw}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def metric(srv, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not in /metrics")


def conversations(srv) -> list[list[int]]:
    ids = lambda text: httpx.post(srv.url + "/tokenize", json={"content": text}).json()["tokens"]  # noqa: E731
    topics = ["parsing a file", "sorting a list", "opening a socket", "hashing a password"]
    return [
        ids(f"# a long helper module about {t}\n" + f"def step_{i}(x):\n    return x + {i}\n" * 6)
        for i, t in enumerate(topics)
    ]


def two_rounds(srv) -> list[tuple[dict, list[int], int]]:
    """Round one: every conversation's first turn (more conversations than slots, so
    the first ones' slots are taken by the later ones). Round two: each follow-up.
    Returns (follow-up answer, its prompt, tokens the first turn consumed) per conversation."""
    prompts = conversations(srv)
    firsts = [complete(srv, p) for p in prompts]
    out = []
    for p, first in zip(prompts, firsts):
        follow = p + first["tokens"] + p[:7]
        out.append((complete(srv, follow), follow, len(p) + len(first["tokens"]) - 1))
    return out


def check_exact(srv, rounds) -> None:
    for answer, follow, _ in rounds:  # cache_prompt false: computed from scratch
        cold = complete(srv, follow, cache_prompt=False)
        assert cold["tokens_cached"] == 0 and answer["tokens"] == cold["tokens"]


def concurrent_hits(srv, first_round) -> None:
    """Two requests for the same next turn at once: both start from the one entry (or
    one from it and one from the other's slot), and both equal a cold run."""
    from concurrent.futures import ThreadPoolExecutor

    answer, follow, _ = first_round
    third = follow + answer["tokens"] + follow[:5]
    hits = metric(srv, "slotserve_prompt_cache_hits_total")
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: complete(srv, third), range(2))
    assert metric(srv, "slotserve_prompt_cache_hits_total") >= hits + 1
    assert min(a["tokens_cached"], b["tokens_cached"]) >= len(follow)
    cold = complete(srv, third, cache_prompt=False)
    assert a["tokens"] == b["tokens"] == cold["tokens"]


@pytest.mark.parametrize("layout", ["--kv-unified", "--no-kv-unified"])
def test_more_conversations_than_slots_continue_from_host_ram(tmp_path, layout):
    with InProcessServer.from_flags(
        "--metrics", "-np", str(N_SLOTS), "-c", "2048", layout, log=tmp_path / "s.log"
    ) as srv:
        srv.wait_ready()
        rounds = two_rounds(srv)
        for answer, _, consumed in rounds[: N_CONVERSATIONS - N_SLOTS]:  # their slots went to others
            assert answer["tokens_cached"] == consumed
        assert metric(srv, "slotserve_prompt_cache_hits_total") >= N_CONVERSATIONS - N_SLOTS
        assert metric(srv, "slotserve_prompt_cache_tokens_restored_total") >= sum(c for _, _, c in rounds[:2])
        assert 0 < metric(srv, "slotserve_prompt_cache_bytes") <= 8192 * 2**20
        check_exact(srv, rounds)
        concurrent_hits(srv, rounds[0])
        props = httpx.get(srv.url + "/props").json()
        assert props["prompt_cache"]["n_entries"] >= N_CONVERSATIONS - N_SLOTS
        assert props["memory"]["integrity"] == "ok"


def test_without_the_cache_the_history_is_recomputed(tmp_path):
    with InProcessServer.from_flags(
        "--metrics", "-np", str(N_SLOTS), "-c", "2048", "--cache-ram", "0", log=tmp_path / "s.log"
    ) as srv:
        srv.wait_ready()
        rounds = two_rounds(srv)
        for answer, _, consumed in rounds[: N_CONVERSATIONS - N_SLOTS]:  # only the header all conversations share
            assert answer["tokens_cached"] < consumed // 4
        assert metric(srv, "slotserve_prompt_cache_hits_total") == 0


def test_a_slot_is_kept_in_host_ram_only_when_most_of_it_would_go(tmp_path):
    """llama-server's rule: a request that keeps at least half of what its slot holds
    (a follow-up that rewrites the end of the last answer, a regenerated answer) saves
    nothing; one that keeps less (another conversation) saves the slot first."""
    with InProcessServer.from_flags("--metrics", "-np", "1", "-c", "2048", log=tmp_path / "s.log") as srv:
        srv.wait_ready()
        first, other = conversations(srv)[:2]
        answer = complete(srv, first, id_slot=0)["tokens"]
        complete(srv, first + answer[:-3] + [5, 6, 7], id_slot=0)  # the answer's end written differently
        complete(srv, first, id_slot=0)  # the answer regenerated
        assert metric(srv, "slotserve_prompt_cache_entries") == 0
        complete(srv, other, id_slot=0)  # another conversation: most of the slot goes
        assert metric(srv, "slotserve_prompt_cache_entries") == 1


@pytest.mark.parametrize(
    "arch,overrides",
    [("mistral", {"sliding_window": 16}), ("granitemoehybrid", GRANITE_HYBRID_TINY)],
    ids=["sliding-window", "hybrid"],
)
def test_windowed_and_hybrid_models_restore_exactly(tmp_path, arch, overrides):
    folder = make_checkpoint(tmp_path / arch, arch, **overrides)
    with InProcessServer.from_flags(
        "--metrics", "-m", str(folder), "-np", str(N_SLOTS), "-c", "2048", log=tmp_path / "s.log"
    ) as srv:
        srv.wait_ready()
        rounds = two_rounds(srv)
        for answer, _, consumed in rounds[: N_CONVERSATIONS - N_SLOTS]:
            assert answer["tokens_cached"] == consumed  # restored where the state ends: nothing to cut
        check_exact(srv, rounds)
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"


def test_a_small_cache_evicts_and_stays_under_its_cap(tmp_path):
    with InProcessServer.from_flags(
        "--metrics", "-np", "1", "-c", "2048", "--cache-ram", "1", log=tmp_path / "s.log"
    ) as srv:
        srv.wait_ready()
        for prompt in conversations(srv):
            complete(srv, prompt)
            assert metric(srv, "slotserve_prompt_cache_bytes") <= 2**20
        assert metric(srv, "slotserve_prompt_cache_evictions_total") >= 1


def disk_files(folder) -> list:
    return sorted(folder.glob("pc-*.slot"))


def test_the_disk_tier_keeps_entries_across_a_restart_and_skips_bad_ones(tmp_path):
    """RAM off, disk on: every history restores from its file; after a graceful restart
    (SIGTERM) the files are found again; a corrupted file and one from another model are
    skipped with a log line (the prompt is computed instead) and never served."""
    import signal

    from memory.files.slot_file import decode, encode

    cache = tmp_path / "cache"
    args = ("-np", "1", "-c", "2048", "--cache-ram", "0", "--cache-disk", str(cache))
    with ServerProcess("--metrics", *args, log=tmp_path / "one.log") as srv:
        srv.wait_ready()
        rounds = two_rounds(srv)
        for answer, _, consumed in rounds:  # one slot: every follow-up's history came back from disk
            assert answer["tokens_cached"] == consumed
        assert metric(srv, "slotserve_prompt_cache_disk_hits_total") >= N_CONVERSATIONS
        on_disk = lambda: sum(f.stat().st_size for f in disk_files(cache))  # noqa: E731
        wait_for(lambda: 0 < metric(srv, "slotserve_prompt_cache_disk_bytes") == on_disk())  # the writer is a thread
        slot = httpx.get(srv.url + "/slots").json()[0]
        assert slot["prompt_cache"] == {"tier": "disk", "n_tokens": rounds[-1][2]}
        check_exact(srv, rounds)  # (cold runs: the slot now holds conversation 3's follow-up)
        follow = rounds[0][1]
        body = {"prompt": follow + rounds[0][0]["tokens"], "max_tokens": 2, "temperature": 0}
        usage = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= len(follow)  # restored tokens count as cached
        srv.signal(signal.SIGTERM)  # the idle slot's state goes to disk on the way out
        assert srv.proc.wait(60) == 0
    files = disk_files(cache)
    assert files and not list(cache.glob(".*"))  # no temporary file left
    first, second = rounds[0], rounds[1]
    third = [first[1] + first[0]["tokens"] + first[1][:5], second[1] + second[0]["tokens"] + second[1][:5]]
    # damage the file of conversation 1's follow-up (the longest entry that starts its third turn)
    by_tokens = {tuple(decode(f.read_bytes()).tokens): f for f in files}
    victim = max((t for t in by_tokens if list(t) == third[1][: len(t)]), key=len)
    data = bytearray(by_tokens[victim].read_bytes())
    data[len(data) // 2] ^= 0xFF
    by_tokens[victim].write_bytes(bytes(data))
    # and a file from another model: a copy of conversation 0's with another fingerprint
    donor = decode(by_tokens[max((t for t in by_tokens if list(t) == third[0][: len(t)]), key=len)].read_bytes())
    foreign = encode(donor.tokens, donor.state, {"arch": "other"})
    (cache / "pc-0000000000000000000000000000000000000000.slot").write_bytes(foreign)
    with ServerProcess("--metrics", *args, log=tmp_path / "two.log") as srv:
        srv.wait_ready()
        kept = complete(srv, third[0])
        assert (
            kept["tokens_cached"] >= len(first[1])
            and kept["tokens"] == complete(srv, third[0], cache_prompt=False)["tokens"]
        )
        bad = complete(srv, third[1])
        assert bad["tokens_cached"] < len(victim)  # not served from the damaged file
        assert bad["tokens"] == complete(srv, third[1], cache_prompt=False)["tokens"]
        assert metric(srv, "slotserve_prompt_cache_disk_skipped_total") >= 2
    log = (tmp_path / "two.log").read_text()
    assert "skipping pc-0000000000000000000000000000000000000000.slot" in log
    assert f"skipping {by_tokens[victim].name}" in log and "checksum" in log


def test_blocks_kept_by_hash_serve_a_shared_start_after_its_slot_moved_on(tmp_path):
    """Unified pool, one slot, no prompt cache: a system prompt's blocks outlive the
    request that computed them; after another prompt took the slot, a third prompt with
    the same start takes them from the pool and answers as a cold run does."""
    args = ("-np", "1", "-c", "2048", "--kv-unified", "--block-size", "16", "--cache-ram", "0")
    with InProcessServer.from_flags("--metrics", *args, log=tmp_path / "s.log") as srv:
        srv.wait_ready()
        system, other = conversations(srv)[:2]
        complete(srv, system + system[:9])
        complete(srv, other)  # shares (almost) nothing: the slot's cache is replaced
        assert metric(srv, "slotserve_kv_cache_blocks_cached") >= len(system) // 16
        third = system + other[-11:]
        answer = complete(srv, third)
        assert answer["tokens_cached"] >= len(system) // 16 * 16 - 16  # whole blocks of the shared start
        assert metric(srv, "slotserve_prefix_cache_tokens_total") >= answer["tokens_cached"]
        assert answer["tokens"] == complete(srv, third, cache_prompt=False)["tokens"]
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
