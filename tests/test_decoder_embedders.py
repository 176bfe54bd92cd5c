"""Decoder embedding models as they are published (issue 54, item 2): Qwen3-Embedding's
tokenizer appends EOS through its post-processor, and its last-token pooling reads the
hidden state at that EOS; its weights are the bare ``Qwen3Model`` tensors (no
``model.`` prefix, no LM head) under a ``Qwen3ForCausalLM`` config, or under their own
``Qwen3Model`` one. The GGUF file the pinned converter writes says
``tokenizer.ggml.add_eos_token = true``: the server must append EOS from that flag, or
every vector is the last text token's. Oracle: transformers' tokenizer and
``last_hidden_state``, normalized, on the same checkpoint."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from checkpoints import make_checkpoint
from server_proc import ServerProcess

from engine import Engine, SamplingParams

TEXTS = ["a query about sliding windows", "slots, caches and files", "x"]


def embedder_folder(root, architecture: str):
    """A tiny Qwen3 checkpoint in Qwen3-Embedding's published layout: bare model tensors
    (saved by ``Qwen3Model``), ``architectures`` as given, a tokenizer whose
    post-processor appends ``<eos>``."""
    import transformers
    from safetensors.torch import load_file, save_file

    folder = make_checkpoint(root / architecture, "qwen3", eos_token_id=256, tie_word_embeddings=False)
    weights = load_file(str(folder / "model.safetensors"))
    bare = {k.removeprefix("model."): v for k, v in weights.items() if k != "lm_head.weight"}
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer.json").read_text())
    eos = {"id": "<eos>", "ids": [256], "tokens": ["<eos>"]}
    a, b = ({"Sequence": {"id": s, "type_id": 0}} for s in "AB")
    end = {"SpecialToken": {"id": "<eos>", "type_id": 0}}
    tok["post_processor"] = {"type": "TemplateProcessing", "single": [a, end], "pair": [a, end, b, end],
                             "special_tokens": {"<eos>": eos}}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": "<eos>"}))
    assert transformers.AutoTokenizer.from_pretrained(str(folder))("x")["input_ids"][-1] == 256
    return folder


def reference(folder) -> torch.Tensor:
    """transformers: each text's ids (EOS last), its last hidden state there, normalized."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            assert ids[-1] == 256
            rows.append(model(torch.tensor([ids])).last_hidden_state[0, -1])
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedders")
    folder = embedder_folder(root, "Qwen3ForCausalLM")
    return folder, reference(folder)


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen3Model"])
def test_the_published_layout_loads_and_pools_at_the_eos_its_tokenizer_adds(tmp_path, caplog, architecture):
    """Bare tensors under either config load (the missing head stands in from the input
    embeddings, as llama.cpp does); the folder's tokenizer appends EOS; the last-token
    pooling equals transformers'."""
    folder = embedder_folder(tmp_path, architecture)
    expected = reference(folder)
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    assert "no LM head; the input embeddings stand in for it" in caplog.text
    for text, want in zip(TEXTS, expected):
        ids = engine.tokenizer.encode(text)
        assert ids[-1] == 256
        seq = engine.add_sequence(ids, SamplingParams(max_tokens=1), 0, pooling="last")
        got = None
        while seq in engine.running:
            got = next((ev.embedding for ev in engine.step() if ev.seq is seq and ev.finished), got)
        vec = torch.nn.functional.normalize(torch.tensor(got).reshape(-1), dim=-1)  # [hidden]
        assert torch.dot(vec, want) > 1 - 1e-5
        engine.memory.seq_rm(0)


def test_a_gguf_files_add_eos_flag_appends_eos_and_the_served_vectors_are_transformers(published, tmp_path):
    """The converter writes ``add_eos_token = true`` from the post-processor; served
    from the GGUF file, /v1/embeddings (text inputs) answers transformers' vectors."""
    from gguf_tools import convert, reader_of

    folder, expected = published
    gguf_file = convert(folder, tmp_path / "embed.gguf")
    field = reader_of(gguf_file).fields["tokenizer.ggml.add_eos_token"]
    assert bool(field.parts[field.data[0]][0])
    with ServerProcess("-m", str(gguf_file), "-np", "1", "-c", "256", "--embeddings", "--pooling", "last") as srv:
        srv.wait_ready()
        answer = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
        assert answer.status_code == 200, answer.text
        got = torch.tensor([row["embedding"] for row in answer.json()["data"]])
        tokenized = httpx.post(srv.url + "/tokenize", json={"content": "x", "add_special": True}, timeout=30)
        tokens = tokenized.json()["tokens"]
    assert tokens[-1] == 256  # EOS appended, as llama.cpp's tokenizer does with the flag
    cosines = (torch.nn.functional.normalize(got, dim=-1) * expected).sum(-1)
    assert (cosines > 1 - 1e-5).all(), cosines


def test_dimensions_cut_a_matryoshka_models_vectors_and_other_models_refuse_them(published, tmp_path):
    """``dimensions`` (OpenAI's, with vLLM's rule): a model whose config says
    ``matryoshka_dimensions`` answers the leading values of its vector, normalized after
    the cut, in the sizes it lists; a size it does not list, or any other size on a model
    that is not Matryoshka, is a 400 in the OpenAI error shape."""
    import shutil

    folder = tmp_path / "mrl"
    shutil.copytree(published[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    with ServerProcess("-m", str(folder), "-np", "1", "-c", "256", "--embeddings", "--pooling", "last") as srv:
        srv.wait_ready()

        def post(**body) -> httpx.Response:
            return httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[:2], **body}, timeout=60)

        raw = torch.tensor([row["embedding"] for row in post(embd_normalize=-1).json()["data"]])  # [2, 64]
        answer = post(dimensions=16)
        assert answer.status_code == 200, answer.text
        cut = torch.tensor([row["embedding"] for row in answer.json()["data"]])
        assert cut.shape == (2, 16)
        torch.testing.assert_close(cut, torch.nn.functional.normalize(raw[:, :16], dim=-1), atol=1e-6, rtol=1e-5)
        assert post(dimensions=64).status_code == 200  # its own size, always
        refused = post(dimensions=24)
        assert refused.status_code == 400 and "16, 32" in refused.json()["error"]["message"]
    shutil.rmtree(folder)
    with ServerProcess("-m", str(published[0]), "-np", "1", "-c", "256", "--embeddings") as srv:
        srv.wait_ready()
        refused = httpx.post(srv.url + "/v1/embeddings", json={"input": "x", "dimensions": 16}, timeout=60)
        assert refused.status_code == 400 and "not a Matryoshka model" in refused.json()["error"]["message"]


def test_the_servers_embd_normalize_is_the_default_a_request_overrides(published):
    """``--embd-normalize -1``: vectors as pooled (no request field); a request's
    ``embd_normalize`` 2 still gets unit vectors."""
    folder, expected = published
    with ServerProcess("-m", str(folder), "-np", "1", "-c", "256", "--embeddings", "--embd-normalize", "-1") as srv:
        srv.wait_ready()

        def vectors(**body) -> torch.Tensor:
            answer = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS, **body}, timeout=60)
            assert answer.status_code == 200, answer.text
            return torch.tensor([row["embedding"] for row in answer.json()["data"]])

        raw, unit = vectors(), vectors(embd_normalize=2)
    norms = raw.norm(dim=-1)
    assert ((norms - 1).abs() > 1e-2).all()  # not normalized
    torch.testing.assert_close(raw / norms[:, None], unit, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(unit, expected, atol=1e-5, rtol=1e-4)
