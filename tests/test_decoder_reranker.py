"""A decoder reranker (issue 54, item 2): Qwen3-Reranker scores a (query, document) pair
by its next-token logits for "yes" and "no" at the end of its prompt. A tiny Qwen3 in
the published layout, served with ``--rerank``, and the GGUF file llama.cpp's converter
writes from it (``cls.output`` holding the two rows, pooling rank, the rerank template),
served with no flag: both give transformers' own P(yes) on the same prompts."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from checkpoints import make_checkpoint, write_byte_tokenizer
from server_proc import ServerProcess

from engine.loading.rank_head import TEMPLATE

QUERY = "what keeps a session warm?"
DOCS = ["slots hold the cache", "a GPU", "slot files on disk", "yes no yes", "<Query>: nothing"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """(folder, its GGUF, transformers' P(yes) per document): untied head, a byte-level
    tokenizer with ChatML's markers and "yes" / "no" as tokens of their own."""
    import transformers
    from gguf_tools import convert

    root = tmp_path_factory.mktemp("rr")
    folder = make_checkpoint(root / "qwen3-reranker-tiny", "qwen3", tie_word_embeddings=False)
    write_byte_tokenizer(folder, specials=("<|im_start|>", "<|im_end|>"))
    tok = json.loads((folder / "tokenizer.json").read_text())
    n = max(t["id"] for t in tok["added_tokens"]) + 1
    tok["added_tokens"] += [{"id": n + i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": False} for i, w in enumerate(("yes", "no"))]  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    yes, no = hf_tok.convert_tokens_to_ids("yes"), hf_tok.convert_tokens_to_ids("no")
    assert (yes, no) == (n, n + 1)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    expected = []
    with torch.no_grad():
        for doc in DOCS:
            prompt = TEMPLATE.replace("{query}", QUERY).replace("{document}", doc)
            ids = hf_tok(prompt, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0, -1]
            expected.append(torch.softmax(logits[[no, yes]], -1)[1].item())  # the model card's score
    gguf_file = convert(folder, root / "qwen3-reranker-tiny.gguf")
    return folder, gguf_file, expected


def _scores(url: str, raw: bool = False) -> list[float]:
    r = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS, "raw_scores": raw}, timeout=120)
    assert r.status_code == 200, r.text
    got = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
    return [got[i] for i in range(len(DOCS))]


def test_a_folder_served_with_rerank_scores_as_transformers(reranker):
    folder, _, expected = reranker
    with ServerProcess("-m", str(folder), "-np", "2", "-c", "1024", "--rerank") as srv:
        srv.wait_ready()
        assert _scores(srv.url) == pytest.approx(expected, abs=1e-4)
        log_odds = _scores(srv.url, raw=True)
        assert [1 / (1 + math.exp(-x)) for x in log_odds] == pytest.approx(expected, abs=1e-4)
        again = _scores(srv.url)  # the pairs' shared head now comes from the slots' caches
        assert again == pytest.approx(expected, abs=1e-4)
        long = "slot caches keep a conversation warm " * 200  # past the slot's 512 positions
        body = {"query": QUERY, "documents": [DOCS[0], long]}
        assert httpx.post(srv.url + "/v1/rerank", json=body, timeout=120).status_code == 400
        r = httpx.post(srv.url + "/v1/rerank", json={**body, "truncate": True}, timeout=120)
        assert r.status_code == 200, r.text  # the document cut to fit (it was refused whatever truncate said)
        got = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
        assert got[0] == pytest.approx(expected[0], abs=1e-4) and 0 < got[1] < 1
        assert r.json()["usage"]["prompt_tokens"] > 500
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "slots", "max_tokens": 2})
        assert r.status_code == 200  # a decoder reranker still generates
        assert "rerank" in httpx.get(srv.url + "/v1/models").json()["models"][0]["capabilities"]


def test_the_converters_reranker_file_ranks_without_a_flag(reranker):
    """The file's ``cls.output`` rows (yes, no), its pooling type (rank) and its
    ``tokenizer.chat_template.rerank``: no --rerank needed, the folder's scores."""
    from gguf_tools import reader_of

    _, gguf_file, expected = reranker
    fields = reader_of(gguf_file).fields
    assert "cls.output.weight" in {t.name for t in reader_of(gguf_file).tensors}
    assert "tokenizer.chat_template.rerank" in fields
    with ServerProcess("-m", str(gguf_file), "-np", "2", "-c", "1024") as srv:
        srv.wait_ready()
        assert _scores(srv.url) == pytest.approx(expected, abs=1e-4)
