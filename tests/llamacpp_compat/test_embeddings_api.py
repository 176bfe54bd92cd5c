"""Embeddings over HTTP (server/routes/embeddings_api.py) with ``--embeddings``: OpenAI's
/v1/embeddings through the ``openai`` SDK and llama-server's /embedding(s), against
transformers' hidden states pooled and normalized the same way (fp32, 1e-5); every
input shape llama-server takes; base64; usage; pooling ``none``; the 4xx/501s; and
generation beside embeddings keeps its exact tokens."""

from __future__ import annotations

import base64
import struct
import threading
import time

import httpx
import openai
import pytest
import torch
from checkpoints import load_reference, make_checkpoint
from server_proc import InProcessServer

TEXTS = ["I believe the meaning of life is", "This is a test", "def add(a, b):\n    return a + b\n" * 6]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("embed") / "llama", "llama")


@pytest.fixture(scope="module")
def ref(folder):
    return load_reference(folder)


@pytest.fixture(scope="module")
def srv(folder):
    with InProcessServer(model=folder, embeddings=True, pooling="mean", parallel=2, ctx_size=512, batch_size=32) as s:
        yield s


def hidden(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref.base_model(torch.tensor([ids])).last_hidden_state[0]  # [T, hidden]


def tokens(srv, text: str) -> list[int]:
    return httpx.post(srv.url + "/tokenize", json={"content": text, "add_special": True}).json()["tokens"]


def test_openai_embeddings_are_transformers_mean_pooled_and_normalized(srv, ref):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    out = client.embeddings.create(model="m", input=TEXTS)
    assert [d.index for d in out.data] == [0, 1, 2] and out.object == "list"
    ids = [tokens(srv, t) for t in TEXTS]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(map(len, ids))
    for d, t in zip(out.data, ids):
        expected = torch.nn.functional.normalize(hidden(ref, t).mean(0), dim=0)
        torch.testing.assert_close(torch.tensor(d.embedding), expected, atol=1e-5, rtol=0)
    one = client.embeddings.create(model="m", input=TEXTS[1])
    assert one.data[0].embedding == pytest.approx(out.data[1].embedding, abs=1e-6)  # alone or batched
    raw = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == pytest.approx(one.data[0].embedding, abs=1e-7)


def test_every_input_shape_llama_server_takes(srv):
    def post(data, path="/v1/embeddings"):
        r = httpx.post(srv.url + path, json=data, timeout=60)
        assert r.status_code == 200, (data, r.text)
        return r.json()

    ids = tokens(srv, "hello world")
    base = post({"input": "hello world"})["data"][0]["embedding"]
    assert post({"input": ids})["data"][0]["embedding"] == pytest.approx(base, abs=1e-6)
    mixed = post({"input": [ids[0], "ello", *ids[5:]]})["data"]
    assert len(mixed) == 1 and mixed[0]["embedding"] == pytest.approx(base, abs=1e-6)
    parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    many = post({"input": ["hello world", parts, {"prompt_string": "hello world"}, ids]})["data"]
    assert len(many) == 4 and all(d["embedding"] == pytest.approx(base, abs=1e-6) for d in many)
    native = post({"content": "hello world"}, "/embedding")
    assert native[0]["index"] == 0 and native[0]["embedding"][0] == pytest.approx(base, abs=1e-6)
    assert post({"content": "hello world"})[0]["embedding"][0] == pytest.approx(base, abs=1e-6)  # llama-server's
    raw = post({"content": "hello world", "embd_normalize": -1}, "/embeddings")[0]["embedding"][0]
    assert sum(x * x for x in raw) != pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    "data, says",
    [
        ({"input": []}, None),
        ({"input": {"content": "string"}}, None),
        ({"input": {"content": [{"type": "unknown"}]}}, None),
        ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}, None),
        ({"input": ""}, "empty"),
        ({"model": "m"}, '"input" or "content"'),
        ({"input": "This is a test " * 300}, "too large"),
        ({"input": "x", "encoding_format": "bytes"}, None),
        ({"input": ["ok", [10**9]]}, None),  # one bad input refuses them all
    ],
)
def test_bad_inputs_are_400s_and_change_nothing(srv, data, says):
    r = httpx.post(srv.url + "/v1/embeddings", json=data, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] in ("invalid_request_error", "exceed_context_size_error")
    assert says is None or says in r.json()["error"]["message"]
    slots = httpx.get(srv.url + "/slots").json()
    assert not any(s["is_processing"] for s in slots)


def test_generation_beside_embeddings_keeps_its_tokens(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    alone = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    stop, done = threading.Event(), []

    def embed_load():
        while not stop.is_set():
            r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[2]}, timeout=60)
            done.append((time.monotonic(), r.status_code))

    worker = threading.Thread(target=embed_load)
    worker.start()
    try:
        t0 = time.monotonic()
        beside = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        t1 = time.monotonic()
    finally:
        stop.set()
        worker.join()
    assert beside == alone
    assert {code for _, code in done} == {200} and any(t0 < t < t1 for t, _ in done)  # they really overlapped


def test_pooling_none_gives_every_tokens_vector_natively_only(folder, ref):
    with InProcessServer(model=folder, embeddings=True, pooling="none", parallel=1, ctx_size=256) as s:
        r = httpx.post(s.url + "/embeddings", json={"input": "hello hello hello"}, timeout=60)
        ids = tokens(s, "hello hello hello")
        got = torch.tensor(r.json()[0]["embedding"])
        torch.testing.assert_close(got, hidden(ref, ids), atol=1e-5, rtol=0)  # [T, hidden], unnormalized
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hello"}, timeout=60)
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]


def test_embeddings_are_off_without_the_flag(demo_server):
    for path in ("/v1/embeddings", "/embedding", "/embeddings"):
        r = httpx.post(demo_server.url + path, json={"input": "hi"}, timeout=60)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
