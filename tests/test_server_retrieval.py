"""Encoder models served over HTTP (issue 54): a sentence-transformers BERT folder on
/v1/embeddings (the ``openai`` client) and llama-server's /embedding, cross-encoder
rerankers (BERT, XLM-RoBERTa) on /v1/rerank and its aliases, against
sentence-transformers' own SentenceTransformer.encode and CrossEncoder.predict on the
same folders. An encoder generates nothing, keeps no slot, and serves batches of any
size through its own queue."""

from __future__ import annotations

import base64
import json
import struct

import httpx
import numpy as np
import pytest
import torch
from encoders import make_bert_embedder, make_cross_encoder
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

TEXTS = ["the slot and the cache", "a query", "Slot, cache; QUERY!", "window of a file and a query"]
QUERY = "the slot cache"
DOCS = ["a window of the file", "retrieval and query", "slot", "Cache of 42 files, and the query.", "the the the"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """(folder, running server) of a BERT mean-pooling, normalizing embedder, declared
    Matryoshka (config.json's ``matryoshka_dimensions``: 16 and 32 of its 64)."""
    folder = make_bert_embedder(tmp_path_factory.mktemp("emb") / "bert-emb", pooling="mean")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    with ServerProcess("-m", str(folder), "--metrics", "--max-queue", "4") as srv:
        srv.wait_ready()
        yield folder, srv


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def reranker(request, tmp_path_factory):
    """(folder, running server) of a cross-encoder: the BERT one started with --rerank,
    the XLM-RoBERTa one with no flag (its head says it ranks)."""
    folder = make_cross_encoder(tmp_path_factory.mktemp("rr") / f"{request.param}-rr", request.param)
    flags = ("--rerank",) if request.param == "bert" else ()
    with ServerProcess("-m", str(folder), *flags) as srv:
        srv.wait_ready()
        yield folder, srv


def test_the_openai_client_gets_sentence_transformers_vectors(embedder):
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    folder, srv = embedder
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)  # normalized by its Normalize module
    client = OpenAI(base_url=srv.url + "/v1", api_key="none")
    got = client.embeddings.create(model="bert-emb", input=TEXTS)
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == expected.shape
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert got.usage.prompt_tokens == sum(len(x) for x in _tokens(srv, TEXTS))
    packed = client.embeddings.create(model="bert-emb", input=TEXTS[:2], encoding_format="base64")
    for item, want in zip(packed.data, expected):
        raw = base64.b64decode(item.embedding) if isinstance(item.embedding, str) else None
        values = struct.unpack(f"<{len(want)}f", raw) if raw is not None else item.embedding
        np.testing.assert_allclose(values, want, atol=1e-5)


def test_dimensions_cut_a_matryoshka_encoders_vectors(embedder):
    """``dimensions`` of a Matryoshka encoder: sentence-transformers' vectors cut to that
    many leading values (``truncate_dim``), normalized again; a length the model does not
    list, or any on a model that lists none, is a 400."""
    from sentence_transformers import SentenceTransformer

    folder, srv = embedder
    cut = SentenceTransformer(str(folder), device="cpu", truncate_dim=16)
    expected = cut.encode(TEXTS, normalize_embeddings=True)
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS, "dimensions": 16})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], expected, atol=1e-5)
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS, "dimensions": 24})
    assert r.status_code == 400 and "16, 32" in r.json()["error"]["message"]


def _tokens(srv, texts):
    return [httpx.post(srv.url + "/tokenize", json={"content": t, "add_special": True}).json()["tokens"] for t in texts]


def test_native_routes_answer_unnormalized_and_per_token_on_request(embedder):
    from sentence_transformers import SentenceTransformer

    folder, srv = embedder
    model = SentenceTransformer(str(folder), device="cpu")
    raw = SentenceTransformer(modules=[model[0], model[1]], device="cpu").encode(TEXTS[0])  # no Normalize
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3  # so this compares the unnormalized vector
    r = httpx.post(srv.url + "/embedding", json={"content": TEXTS[0], "embd_normalize": -1})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()[0]["embedding"][0], raw, atol=1e-5)
    ids = _tokens(srv, [TEXTS[0]])[0]  # token ids as input: the same vector
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ids, "embd_normalize": -1})
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], raw, atol=1e-5)
    # a mixed prompt's first text piece gets the special tokens (llama-server's tokenize_mixed)
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": [[TEXTS[0]], [TEXTS[0], 7], ids + [7]]})
    got = [d["embedding"] for d in r.json()["data"]]
    np.testing.assert_allclose(got[0], raw / np.linalg.norm(raw), atol=1e-5)
    np.testing.assert_allclose(got[1], got[2], atol=1e-6)  # [CLS] text [SEP] 7


def test_an_input_over_the_limit_is_refused_or_cut_as_sentence_transformers_cuts(embedder):
    from sentence_transformers import SentenceTransformer

    folder, srv = embedder
    long = "retrieval of a file " * 30  # far over the folder's max_seq_length (48)
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["a query", long]})
    assert r.status_code == 400
    assert "input[1]" in r.json()["error"]["message"] and "48" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["a query", long], "truncate": True})
    assert r.status_code == 200, r.text
    expected = SentenceTransformer(str(folder), device="cpu").encode(["a query", long])
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], expected, atol=1e-5)


def test_an_encoder_refuses_generation_and_says_what_it_serves(embedder):
    _, srv = embedder
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 501 and "encoder" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/completion", json={"prompt": "hi"})
    assert r.status_code == 501
    r = httpx.post(srv.url + "/v1/rerank", json={"query": "a", "documents": ["b"]})
    assert r.status_code == 501 and "--rerank" in r.json()["error"]["message"]
    listed = httpx.get(srv.url + "/v1/models").json()
    assert listed["models"][0]["capabilities"] == ["embedding"]
    assert listed["data"][0]["meta"]["n_embd"] == 64
    props = httpx.get(srv.url + "/props").json()
    assert props["encoder"] == {"architecture": "BertModel", "pooling": "mean", "n_embd": 64, "rerank": False}
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}


def test_an_embedding_gemma_gguf_file_serves_sentence_transformers_vectors(embedding_gemma_files):
    """EmbeddingGemma's GGUF file with its Dense modules (the converter's
    ``--sentence-transformers-dense-modules``) served as llama-server serves it: the
    ``openai`` client gets sentence-transformers' vectors of its folder, of the Dense
    modules' size; /props names what it embeds."""
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    folder, gguf_file = embedding_gemma_files["folder"], embedding_gemma_files["full"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    with ServerProcess("-m", str(gguf_file)) as srv:
        srv.wait_ready()
        got = OpenAI(base_url=srv.url + "/v1", api_key="none").embeddings.create(model="eg", input=TEXTS)
        np.testing.assert_allclose(np.array([d.embedding for d in got.data]), expected, atol=1e-5)
        props = httpx.get(srv.url + "/props").json()
        assert props["encoder"] == {"architecture": "Gemma3TextModel", "pooling": "mean", "n_embd": 48, "rerank": False}
        assert props["bos_token"] == "<bos>" and props["eos_token"] == "<eos>"
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS, "dimensions": 16})
        assert r.status_code == 400 and "not a Matryoshka model" in r.json()["error"]["message"]


def test_a_batch_larger_than_the_queue_is_served_and_counted(embedder):
    """2,048 inputs in one request, as many as --max-inputs takes (--max-queue 4 bounds
    requests, not inputs), with a one-input request beside it; /metrics counts every input."""
    import concurrent.futures

    _, srv = embedder
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)}
    before = families["slotserve_encoder_inputs"].samples[0].value
    words = ["slot", "cache", "query", "window", "file", "retrieval"]
    batch = [" ".join(words[(i + k) % 6] for k in range(1 + i % 7)) + f" {i}" for i in range(2048)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        big = pool.submit(httpx.post, srv.url + "/v1/embeddings", json={"input": batch}, timeout=600)
        small = pool.submit(httpx.post, srv.url + "/v1/embeddings", json={"input": batch[123]}, timeout=600)
        big, small = big.result(), small.result()
    assert big.status_code == 200 and small.status_code == 200, (big.text[:300], small.text[:300])
    data = big.json()["data"]
    assert [d["index"] for d in data] == list(range(2048))
    np.testing.assert_allclose(data[123]["embedding"], small.json()["data"][0]["embedding"], atol=1e-6)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)}
    assert families["slotserve_encoder_inputs"].samples[0].value - before == 2049
    assert families["slotserve_encoder_requests_waiting"].samples[0].value == 0


def _cross_encoder_scores(folder, docs, raw=False):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu", max_length=64)  # the position table's length
    kwargs = {"activation_fn": torch.nn.Identity()} if raw else {}
    return model.predict([(QUERY, d) for d in docs], **kwargs)


def test_rerank_scores_are_the_cross_encoders(reranker):
    folder, srv = reranker
    expected = _cross_encoder_scores(folder, DOCS)  # sigmoid of the one logit, as CrossEncoder.predict
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    got = {res["index"]: res["relevance_score"] for res in body["results"]}
    assert sorted(got) == list(range(len(DOCS)))
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=1e-4)
    scores = [res["relevance_score"] for res in body["results"]]
    assert scores == sorted(scores, reverse=True)  # best first
    assert body["usage"]["prompt_tokens"] > len(DOCS) * 3
    raw = httpx.post(srv.url + "/rerank", json={"query": QUERY, "documents": DOCS, "raw_scores": True}).json()
    logits = {res["index"]: res["relevance_score"] for res in raw["results"]}
    np.testing.assert_allclose(
        [logits[i] for i in range(len(DOCS))], _cross_encoder_scores(folder, DOCS, True), atol=1e-4
    )


def test_rerank_fields_of_jina_cohere_and_tei(reranker):
    folder, srv = reranker
    expected = _cross_encoder_scores(folder, DOCS)
    best = list(np.argsort(-expected))
    objects = [{"text": d} for d in DOCS]  # Jina's and Cohere's document objects
    for path in ("/v1/rerank", "/reranking", "/v1/reranking"):
        r = httpx.post(
            srv.url + path, json={"query": QUERY, "documents": objects, "top_n": 2, "return_documents": True}
        )
        assert r.status_code == 200, (path, r.text)
        results = r.json()["results"]
        assert [res["index"] for res in results] == best[:2]
        assert [res["document"]["text"] for res in results] == [DOCS[i] for i in best[:2]]
    tei = httpx.post(srv.url + "/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [item["index"] for item in tei] == best
    assert [item["text"] for item in tei] == [DOCS[i] for i in best]
    np.testing.assert_allclose([item["score"] for item in tei], expected[best], atol=1e-4)
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": []})
    assert r.status_code == 400
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": "a"})
    assert r.status_code == 400 and "/v1/rerank" in r.json()["error"]["message"]


def test_a_thousand_document_rerank_is_served_and_long_pairs_are_refused_or_cut(reranker):
    folder, srv = reranker
    docs = [f"{DOCS[i % len(DOCS)]} {i}" for i in range(1000)]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": docs}, timeout=600)
    assert r.status_code == 200, r.text[:300]
    got = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
    assert len(got) == 1000
    sample = [0, 1, 499, 999]
    np.testing.assert_allclose(
        [got[i] for i in sample], _cross_encoder_scores(folder, [docs[i] for i in sample]), atol=1e-4
    )
    long = "retrieval of a file " * 40
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": ["slot", long]})
    assert r.status_code == 400 and "documents[1]" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": ["slot", long], "truncate": True})
    assert r.status_code == 200, r.text
    got = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
    np.testing.assert_allclose(got[1], _cross_encoder_scores(folder, [long])[0], atol=1e-4)  # cut as it cuts
    assert httpx.get(srv.url + "/v1/models").json()["models"][0]["capabilities"] == ["rerank"]


def test_more_inputs_or_documents_than_the_server_takes_are_a_400(embedder, reranker):
    """--max-inputs (2048 by default, OpenAI's own bound) bounds an embeddings request's
    inputs and a rerank request's documents: one more is a 400 naming the setting, before
    any work (it was seconds of work and hundreds of MB for a 1 MB body), and the server
    serves on. Token ids are one input however many; the document says both."""
    _, srv = embedder
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["a"] * 2049})
    assert r.status_code == 400 and "--max-inputs" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/embedding", json={"content": ["a"] * 2049})
    assert r.status_code == 400
    assert httpx.post(srv.url + "/v1/embeddings", json={"input": ["a"] * 3}).status_code == 200
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": [5] * 3000, "truncate": True})
    assert r.status_code == 200 and len(r.json()["data"]) == 1  # ids: one input, cut to the encoder's limit
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": "a query", "content": "a query"})
    assert r.status_code == 400 and "send one" in r.json()["error"]["message"]  # content was ignored, unchecked
    listed = httpx.get(srv.url + "/openapi.json").json()["components"]["schemas"]["EmbeddingRequest"]
    forms = next(f for f in listed["properties"]["input"]["anyOf"] if "anyOf" in f)["anyOf"]
    assert [f.get("maxItems") for f in forms] == [None, 2048] and forms[0]["contains"] == {"type": "integer"}
    _, srv = reranker
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": ["a"] * 2049})
    assert r.status_code == 400 and "2049 documents" in r.json()["error"]["message"]
    listed = httpx.get(srv.url + "/openapi.json").json()["components"]["schemas"]["RerankRequest"]
    assert [f.get("maxItems") for f in listed["properties"]["documents"]["anyOf"]] == [2048, None]


def test_rerank_with_a_generation_model_fails_at_start_with_a_clear_line(tmp_path):
    from checkpoints import make_checkpoint

    model = make_checkpoint(tmp_path / "m", "llama")
    log = tmp_path / "server.log"
    srv = ServerProcess("-m", str(model), "--rerank", log=log)
    try:
        assert srv.proc.wait(120) != 0
    finally:
        srv.stop()
    assert "--rerank needs a reranker" in log.read_text()
