"""Issue 53's families through a real server: a conversation's follow-up reuses its
slot, a slot file saved to a real directory restores into another slot and continues
as transformers does on the whole text. gpt-oss keeps rings for its window layers (and
full-size caches under --swa-full), its sinks included in every path."""

from __future__ import annotations

import httpx
import pytest
import torch
from checkpoints import (
    GLM4_MOE_TINY,
    GPT_OSS_TINY,
    QWEN2_MOE_TINY,
    QWEN3_MOE_TINY,
    SMOLLM3_TINY,
    greedy_reference,
    load_reference,
    make_checkpoint,
)
from server_proc import InProcessServer

FAMILIES = {
    "qwen3_moe": (QWEN3_MOE_TINY, ()),
    "qwen2_moe": (QWEN2_MOE_TINY, ()),
    "glm4_moe": (GLM4_MOE_TINY, ()),
    "smollm3": (SMOLLM3_TINY, ()),
    "gpt_oss": (GPT_OSS_TINY, ()),
    "gpt_oss-swa-full": (GPT_OSS_TINY, ("--swa-full",)),
}


def complete(srv, prompt: list[int], n: int, id_slot: int, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "id_slot": id_slot, **kw}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def slot_action(srv, slot: int, action: str, **body) -> dict:
    r = httpx.post(f"{srv.url}/slots/{slot}", params={"action": action}, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_follow_up_reuses_the_slot_and_a_slot_file_continues_as_transformers(tmp_path, name):
    fields, flags = FAMILIES[name]
    arch = name.split("-")[0]
    folder = make_checkpoint(tmp_path / arch, arch, **fields)
    ref = load_reference(folder)
    args = ("-m", str(folder), "-np", "2", "-c", "1024", "--slot-save-path", str(tmp_path / "slots"), *flags)
    with InProcessServer.from_flags(*args, log=tmp_path / "s.log") as srv:
        srv.wait_ready()
        memory = httpx.get(srv.url + "/props").json()["memory"]
        if name == "gpt_oss":  # window 4: a ring per sliding layer beside the full ones
            assert memory["kind"] == "kv_iswa"
            assert [g["kind"] for g in memory["groups"]] == ["attention_full", "attention_sliding"]
        elif name == "gpt_oss-swa-full":
            assert memory["kind"] != "kv_iswa"
        prompt = tokens(20, seed=1)  # five windows long
        first = complete(srv, prompt, 8, id_slot=0)
        assert first["tokens"] == greedy_reference(ref, prompt, 8)[0]
        follow = prompt + first["tokens"] + tokens(6, seed=2)
        warm = complete(srv, follow, 6, id_slot=0)
        assert warm["tokens_cached"] >= len(prompt) + len(first["tokens"]) - 1  # all the first turn held
        assert warm["tokens"] == greedy_reference(ref, follow, 6)[0]
        held = follow + warm["tokens"][:-1]
        assert slot_action(srv, 0, "save", filename=f"{name}.slot")["n_saved"] == len(held)
        assert (tmp_path / "slots" / f"{name}.slot").is_file()
        slot_action(srv, 0, "erase")
        assert slot_action(srv, 1, "restore", filename=f"{name}.slot")["n_restored"] == len(held)
        more = held + tokens(5, seed=3)
        restored = complete(srv, more, 6, id_slot=1)
        assert restored["tokens_cached"] == len(held)  # the file's cells, none computed again
        assert restored["tokens"] == greedy_reference(ref, more, 6)[0]
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
