"""A hybrid model (Granite 4 shape: Mamba2 + attention + MoE) through a real server:
follow-up turns reuse the slot through the recurrent checkpoints and report it
honestly, /slots and /metrics show the checkpoints and the state bytes, and a slot
file restores to an exact continuation in a new process."""

from __future__ import annotations

import httpx
import pytest
from checkpoints import GRANITE_HYBRID_TINY, LFM2_TINY, NEMOTRON_H_TINY, QWEN3_5_TINY, make_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from server_proc import InProcessServer


def complete(srv, prompt, n: int, id_slot: int, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "id_slot": id_slot, **kw}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def slot_action(srv, slot: int, action: str, filename: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=120)


def metric(srv, name: str, **labels) -> float:
    for family in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name} {labels} not in /metrics")


@pytest.mark.parametrize(
    "arch,fields",
    [
        ("granitemoehybrid", GRANITE_HYBRID_TINY),
        ("lfm2", LFM2_TINY),
        ("qwen3_5", QWEN3_5_TINY),
        ("nemotron_h", NEMOTRON_H_TINY),
    ],  # fmt: skip
)
def test_a_hybrid_model_reuses_slots_through_checkpoints(tmp_path, arch, fields):
    """Granite 4 (Mamba2 + attention), LFM2 (short convolutions + attention) and Qwen3.5
    (Gated DeltaNet + gated attention; issue 52):
    a follow-up turn resumes from the live state, an edited turn from a checkpoint, a
    slot saved in one process continues exactly in another, a text model refuses it."""
    folder = make_checkpoint(tmp_path / arch, arch, **fields)
    slots_dir = str(tmp_path / "slots")
    args = ("-m", str(folder), "-np", "2", "-c", "2048", "--slot-save-path", slots_dir)
    args += ("--ssm-checkpoint-every", "32", "--ssm-checkpoints", "8")
    with InProcessServer.from_flags("--metrics", *args, log=tmp_path / "h.log") as srv:
        srv.wait_ready()
        memory = httpx.get(srv.url + "/props").json()["memory"]
        assert memory["kind"] == "hybrid" and [g["kind"] for g in memory["groups"]] == ["attention_full", "recurrent"]
        ids = lambda text: httpx.post(srv.url + "/tokenize", json={"content": text}).json()["tokens"]  # noqa: E731
        prompt = ids("User: tell me about state space models, at length\nAssistant:")
        first = complete(srv, prompt, 40, id_slot=0)
        assert metric(srv, "slotserve_cache_bytes_used", memory_kind="recurrent") > 0
        follow = prompt + first["tokens"] + ids("\nUser: and more\nAssistant:")
        warm = complete(srv, follow, 8, id_slot=0)
        cold = complete(srv, follow, 8, id_slot=1, cache_prompt=False)
        assert warm["tokens_cached"] == len(prompt) + len(first["tokens"]) - 1  # the live state: all it consumed
        assert cold["tokens_cached"] == 0 and warm["tokens"] == cold["tokens"]
        regen = complete(srv, follow, 8, id_slot=0)  # the answer regenerated: one token computed
        assert regen["tokens_cached"] == len(follow) - 1 and regen["tokens"] == warm["tokens"]
        restores = metric(srv, "slotserve_checkpoint_restores_total")
        checkpoints = httpx.get(srv.url + "/slots").json()[0]["checkpoints"]
        assert len(prompt) - 1 in checkpoints and len(follow) - 1 in checkpoints  # each prompt's end but one
        short = prompt[:5]  # a prompt of 5 tokens, re-rendered differently after it: still a hit (from 4)
        complete(srv, short, 4, id_slot=1)
        again = complete(srv, short + ids(" hello"), 6, id_slot=1)
        fresh = complete(srv, short + ids(" hello"), 6, id_slot=0, cache_prompt=False)
        assert again["tokens_cached"] == len(short) - 1 and again["tokens"] == fresh["tokens"]
        assert metric(srv, "slotserve_checkpoint_restores_total") == restores + 1
        rerendered = prompt + ids(" (edited)\nUser: again\nAssistant:")  # shares the first prompt only
        complete(srv, follow, 2, id_slot=0)  # slot 0 holds the conversation again
        edited = complete(srv, rerendered, 8, id_slot=0)
        edited_cold = complete(srv, rerendered, 8, id_slot=1, cache_prompt=False)
        assert 0 < edited["tokens_cached"] <= len(prompt) and edited["tokens"] == edited_cold["tokens"]
        held = rerendered + edited["tokens"][:-1]
        kept = httpx.get(srv.url + "/slots").json()[0]["checkpoints"]
        assert kept and max(kept) >= len(rerendered) - 1
        saved = slot_action(srv, 0, "save", "hybrid.slot")
        assert saved.status_code == 200 and saved.json()["n_saved"] == len(held)
        cold_more = complete(srv, held + ids(" tail"), 8, id_slot=1, cache_prompt=False)
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
    with InProcessServer.from_flags("--metrics", *args, log=tmp_path / "h2.log") as srv:  # a new process
        srv.wait_ready()
        restored = slot_action(srv, 1, "restore", "hybrid.slot")
        assert restored.status_code == 200 and restored.json()["n_restored"] == len(held)
        assert httpx.get(srv.url + "/slots").json()[1]["checkpoints"] == kept  # checkpoints travel too
        more = complete(srv, held + ids(" tail"), 8, id_slot=1)
        assert more["tokens_cached"] == len(held) and more["tokens"] == cold_more["tokens"]
    with InProcessServer.from_flags(
        "--metrics", "-np", "2", "--slot-save-path", slots_dir, log=tmp_path / "d.log"
    ) as demo:  # attention only
        demo.wait_ready()
        before = httpx.get(demo.url + "/slots").json()[0]
        refused = slot_action(demo, 0, "restore", "hybrid.slot")
        assert refused.status_code == 400 and refused.json()["error"]["code"] in ("model_mismatch", "invalid_slot_file")
        assert httpx.get(demo.url + "/slots").json()[0] == before
