"""LoRA over HTTP (--lora, GET/POST /lora-adapters, a request's ``lora``): greedy text
equal to transformers on PEFT's merged model (or the base model at scale 0), requests
with different scales at once, a cache computed with one adapter scale never reused by
another (the slot's own, copied prefixes, slot files), and the 400s; a GGUF LoRA on a
GGUF model, as llama-server users run them."""

from __future__ import annotations

import concurrent.futures

import gguf
import httpx
import numpy as np
import pytest
from checkpoints import greedy_reference, load_reference, make_adapter, make_checkpoint
from gguf_tools import write_gguf
from server_proc import InProcessServer

PROMPT = "def add(a, b):\n    return"
N = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    folder = make_checkpoint(root / "base", "llama")
    merged = make_adapter(folder, root / "adapter", alpha=8.0)
    return folder, root / "adapter", merged, load_reference(folder)


@pytest.fixture(scope="module")
def srv(models, tmp_path_factory):
    folder, adapter, _, _ = models
    slots = tmp_path_factory.mktemp("slots")
    with InProcessServer(model=folder, lora=str(adapter), parallel=3, ctx_size=768, slot_save_path=slots) as s:
        yield s


def complete(srv, **extra) -> dict:
    body = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(srv.url + "/completion", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def expected(srv, model) -> list[int]:
    ids = httpx.post(srv.url + "/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    return greedy_reference(model, ids, N)[0]


def test_adapters_are_listed_and_applied_as_the_merged_model(srv, models):
    _, adapter, merged, base = models
    assert expected(srv, merged) != expected(srv, base)  # the adapter changes what is generated
    listed = httpx.get(srv.url + "/lora-adapters").json()
    assert listed == [{"id": 0, "path": str(adapter), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]
    assert complete(srv)["tokens"] == expected(srv, merged)  # the server's default: scale 1
    assert complete(srv, lora=[{"id": 0, "scale": 0.0}])["tokens"] == expected(srv, base)
    assert complete(srv, lora=[])["tokens"] == expected(srv, base)  # unlisted adapters: 0


def test_requests_with_other_scales_share_the_batch(srv, models):
    _, _, merged, base = models
    scales = [1.0, 0.0, 1.0, 0.0]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        out = list(pool.map(lambda s: complete(srv, lora=[{"id": 0, "scale": s}], cache_prompt=False), scales))
    for s, answer in zip(scales, out):
        assert answer["tokens"] == expected(srv, merged if s else base), s


def test_a_cache_made_with_one_scale_is_never_reused_by_another(srv, models):
    _, _, merged, base = models
    first = complete(srv, id_slot=1, lora=[{"id": 0, "scale": 1.0}])
    assert first["tokens"] == expected(srv, merged)
    other = complete(srv, id_slot=1, lora=[{"id": 0, "scale": 0.0}])  # same prompt, same slot
    assert other["tokens"] == expected(srv, base)  # (a base-model prefix from the pool may be reused)
    again = complete(srv, id_slot=2, lora=[{"id": 0, "scale": 0.0}])  # a copy from slot 1 would be right now
    assert again["tokens"] == expected(srv, base)
    complete(srv, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
    saved = httpx.post(srv.url + "/slots/0?action=save", json={"filename": "a.bin"}, timeout=60)
    assert saved.status_code == 200
    restored = httpx.post(srv.url + "/slots/2?action=restore", json={"filename": "a.bin"}, timeout=60)
    assert restored.status_code == 200
    base_there = complete(srv, id_slot=2, lora=[{"id": 0, "scale": 0.0}])
    assert base_there["tokens"] == expected(srv, base)
    httpx.post(srv.url + "/slots/2?action=restore", json={"filename": "a.bin"}, timeout=60).raise_for_status()
    adapted_there = complete(srv, id_slot=2, lora=[{"id": 0, "scale": 1.0}])
    assert adapted_there["tokens"] == expected(srv, merged) and adapted_there["timings"]["cache_n"] > 0


def test_post_lora_adapters_sets_the_default_and_bad_ids_are_400s(srv, models):
    _, _, merged, base = models
    try:
        r = httpx.post(srv.url + "/lora-adapters", json=[{"id": 0, "scale": 0.0}])
        assert r.status_code == 200 and r.json()[0]["scale"] == 0.0
        assert complete(srv)["tokens"] == expected(srv, base)
    finally:
        httpx.post(srv.url + "/lora-adapters", json=[{"id": 0, "scale": 1.0}]).raise_for_status()
    for path, body in (
        ("/lora-adapters", [{"id": 3, "scale": 1.0}]),
        ("/completion", {"prompt": "x", "lora": [{"id": 3, "scale": 1}]}),
    ):  # noqa: E501
        r = httpx.post(srv.url + path, json=body, timeout=60)
        assert r.status_code == 400 and "no adapter with id 3" in r.json()["error"]["message"]
    assert complete(srv)["tokens"] == expected(srv, merged)


def test_a_gguf_lora_on_a_gguf_model(gguf_lora, tmp_path):
    folder, base_gguf, _, converted, merged = gguf_lora
    labels = {"adapter.lora.task_name": "summarize", "adapter.lora.prompt_prefix": "Summary: "}
    tensors = [(t.name, np.asarray(t.data), None) for t in gguf.GGUFReader(str(converted)).tensors]
    lora_gguf = write_gguf(converted, tmp_path / "labelled.gguf", tensors, labels)  # as llama.cpp's tools label one
    with InProcessServer(model=base_gguf, lora_scaled=f"{lora_gguf}:0.0", parallel=2, ctx_size=512) as s:
        listed = httpx.get(s.url + "/lora-adapters").json()
        assert listed == [
            {"id": 0, "path": str(lora_gguf), "scale": 0.0, "task_name": "summarize", "prompt_prefix": "Summary: "}
        ]
        assert complete(s)["tokens"] == expected(s, load_reference(folder))
        assert complete(s, lora=[{"id": 0, "scale": 1.0}])["tokens"] == expected(s, merged)
