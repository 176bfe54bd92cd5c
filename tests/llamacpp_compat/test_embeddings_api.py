"""Embeddings over HTTP (server/routes/embeddings_api.py) with ``--embeddings``: OpenAI's
/v1/embeddings through the ``openai`` SDK and llama-server's /embedding(s), against
transformers' hidden states pooled and normalized the same way (fp32, 1e-5); every
input shape llama-server takes; base64; usage; pooling ``none``; the 4xx/501s; and
generation beside embeddings keeps its exact tokens."""

from __future__ import annotations

import base64
import struct
import threading

import httpx
import openai
import pytest
import torch
from checkpoints import load_reference, make_checkpoint
from server_proc import InProcessServer
from waiting import wait_for

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


def test_a_batch_larger_than_the_queue_is_served_in_order(srv):
    """LangChain sends 1,000 inputs at a time; more than --max-queue (256) + slots used to
    be refused with 503 whatever the retries. Now inputs are admitted as slots free up."""
    texts = [f"item number {i}" for i in range(300)]
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": texts}, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(300))
    for i in (0, 137, 299):
        alone = httpx.post(srv.url + "/v1/embeddings", json={"input": texts[i]}, timeout=60).json()["data"][0]
        assert data[i]["embedding"] == pytest.approx(alone["embedding"], abs=1e-6)


def test_a_failed_batch_cancels_the_rest_of_itself(srv, monkeypatch):
    """The 5th input fails at admission: the answer is that error, the inputs after it are
    never submitted, and the next batch is served (nothing of the first left queued)."""
    from engine import Failed

    engine = srv.state.engine
    real_submit, submitted = engine.submit, []

    def submit(req, sink):
        submitted.append(req.id)
        if len(submitted) == 5:
            sink(Failed("injected failure", "server_error", 500))  # on the loop, as the scheduler's sink runs
            return req.id
        return real_submit(req, sink)

    monkeypatch.setattr(engine, "submit", submit)
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": [f"text {i}" for i in range(50)]}, timeout=120)
    assert r.status_code == 500 and r.json()["error"]["message"] == "injected failure"
    assert len(submitted) <= 5 + srv.state.settings.parallel  # the window's others at most; never the 50
    monkeypatch.setattr(engine, "submit", real_submit)
    wait_for(lambda: not any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json()), what="slots idle")
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["after"] * 20}, timeout=120)
    assert r.status_code == 200 and len(r.json()["data"]) == 20


def test_generation_beside_embeddings_keeps_its_tokens(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    alone = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    stop, codes = threading.Event(), []

    def embed_load():
        while not stop.is_set():
            codes.append(httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[2]}, timeout=60).status_code)

    def overlapped_run() -> bool:
        """One completion beside the load: its tokens are the same; True once at least
        one embedding finished while it ran (counted, not timed)."""
        before = len(codes)
        beside = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        assert beside == alone
        return len(codes) > before + 1  # one may have been under way at either end

    worker = threading.Thread(target=embed_load)
    worker.start()
    try:
        wait_for(lambda: codes, what="the embedding load")
        wait_for(overlapped_run, timeout=120, what="a completion overlapping an embedding")
    finally:
        stop.set()
        worker.join()
    assert set(codes) == {200}


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
