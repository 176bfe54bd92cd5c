"""Encoder models for embeddings (issue 54, item 1): a BERT (WordPiece) or XLM-RoBERTa
(Unigram, positions after the padding id) folder saved by sentence-transformers gives
sentence-transformers' own vectors (its tokenizer, its truncation, its pooling and
normalization read from the folder), in float32 within 1e-5, alone and batched with
inputs of other lengths."""

from __future__ import annotations

import pytest
import torch
from checkpoints import jitter
from encoders import make_bert_embedder

from engine.core.encoder import EncoderEngine, is_encoder

SCRIPTS = ["Héllo  wörld, naïve café", "Привет мир 42", "日本語のテキスト 🙂", "  spaces   around  "]
TEXTS = ["the slot and the cache", "a query", "retrieval of a file " * 20, "window", "Slot, cache; QUERY!"]


def _batched_as_alone(engine: EncoderEngine, ids: list[list[int]]) -> torch.Tensor:
    """The vectors of ``ids`` run together, checked equal to each run alone (padding in
    a batch changes nothing)."""
    got = torch.stack(engine.embed(ids))
    alone = torch.stack([engine.embed([one])[0] for one in ids])
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
    return got


@pytest.mark.parametrize(
    "kind,pooling,normalize,published",
    [
        ("bert", "mean", True, True),
        ("bert", "cls", False, False),
        ("bert", "lasttoken", True, False),
        ("xlm-roberta", "mean", True, True),
        ("xlm-roberta", "cls", False, False),
    ],
)
def test_an_encoder_folder_embeds_as_sentence_transformers(tmp_path, kind, pooling, normalize, published):
    """``published``: the pooling config in the flags published models carry
    (``pooling_mode_mean_tokens``: true), else as sentence-transformers 6 writes it."""
    import json

    from sentence_transformers import SentenceTransformer

    folder = make_bert_embedder(tmp_path / kind, pooling=pooling, normalize=normalize, kind=kind)
    if published:
        hint = folder / "1_Pooling" / "config.json"
        mode = json.loads(hint.read_text())["pooling_mode"]
        flags = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}
        flags["pooling_mode_mean_tokens"] = mode == "mean"
        flags["pooling_mode_cls_token"] = mode == "cls"
        hint.write_text(json.dumps({"word_embedding_dimension": 64, **flags}))
    assert is_encoder(folder)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    engine = EncoderEngine.from_pretrained(folder, batch_tokens=64)  # several padded batches
    assert engine.config.pooling == {"lasttoken": "last"}.get(pooling, pooling)
    assert engine.config.normalize is normalize
    ids = engine.encode(TEXTS)
    assert len(ids[2]) == 48  # cut at the folder's max_seq_length, [SEP] kept
    got = _batched_as_alone(engine, ids)
    cos = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert (cos > 1 - 1e-5).all(), cos
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)  # the scale too: normalized or not


def test_one_truncation_rule_cuts_texts_and_ids_as_sentence_transformers_does(tmp_path):
    """An input over the limit loses the end of its content and keeps the special tokens
    the tokenizer puts around a text where it has them: a text, and its ids, are cut as
    sentence-transformers cuts the text; ids without them are cut at the end (the rule
    for ids kept their last id, as if it were the closing token)."""
    from sentence_transformers import SentenceTransformer

    long = " ".join(TEXTS) * 4
    for kind in ("bert", "xlm-roberta"):
        folder = make_bert_embedder(tmp_path / kind, kind=kind)
        theirs = SentenceTransformer(str(folder), device="cpu").tokenize([long])["input_ids"][0].tolist()
        engine = EncoderEngine.from_pretrained(folder)
        whole = engine.full_tokenizer.encode(long).ids
        assert len(whole) > len(theirs) == engine.config.max_tokens
        assert engine.encode([long])[0] == engine.cut(whole) == theirs
        bare = whole[1:-1]  # ids without the special tokens
        assert engine.cut(bare) == bare[: engine.config.max_tokens]


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_a_gguf_bert_file_gives_its_folders_tokens_and_vectors(tmp_path, kind):
    """The pinned converter's ``bert`` file (WordPiece with llama.cpp's phantom spaces,
    lower-casing, [CLS]/[SEP] from its add_bos / add_eos flags, mean pooling from
    ``bert.pooling_type``): the same token ids and, normalized, the same vectors as the
    folder it was converted from."""
    from gguf_tools import convert

    folder = make_bert_embedder(tmp_path / kind, pooling="mean", normalize=True, kind=kind)
    gguf_file = convert(folder, tmp_path / f"{kind}.gguf")
    assert is_encoder(gguf_file)
    ours, theirs = EncoderEngine.from_pretrained(gguf_file, normalize=True), EncoderEngine.from_pretrained(folder)
    assert ours.config.pooling == "mean"
    texts = [t for t in TEXTS + SCRIPTS if len(theirs.encode([t])[0]) < 48]  # the file's limit: the position table's
    assert ours.encode(texts) == theirs.encode(texts)
    got, expected = torch.stack(ours.embed(ours.encode(texts))), torch.stack(theirs.embed(theirs.encode(texts)))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_a_gguf_xlm_roberta_reranker_scores_as_its_folder(tmp_path):
    """The converter's XLM-RoBERTa cross-encoder (SentencePiece Unigram as ``t5`` with
    its charsmap; the head as ``cls`` and ``cls.output``): the folder's pair tokens
    (llama-server's BOS q EOS SEP d EOS) and the folder's logits."""
    from encoders import make_cross_encoder
    from gguf_tools import convert

    folder = make_cross_encoder(tmp_path / "xlmr-rr", "xlm-roberta")
    gguf_file = convert(folder, tmp_path / "xlmr-rr.gguf")
    ours, theirs = EncoderEngine.from_pretrained(gguf_file), EncoderEngine.from_pretrained(folder)
    assert ours.config.pooling == theirs.config.pooling == "rank"
    pairs = ours.encode_pairs("the slot cache", TEXTS[:2] + SCRIPTS)
    assert pairs == theirs.encode_pairs("the slot cache", TEXTS[:2] + SCRIPTS)
    ids, types = [p[0] for p in pairs], [p[1] for p in pairs]
    got, expected = torch.stack(ours.embed(ids, "rank", types)), torch.stack(theirs.embed(ids, "rank", types))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_a_gguf_bert_reranker_scores_its_cls_state_without_the_dropped_pooler(tmp_path):
    """The converter drops BERT's pooler (dense, tanh) and keeps ``classifier`` as
    ``cls.output``, so the file's score is the projection of the [CLS] state alone, as
    llama.cpp computes it: checked against transformers' own modules on the folder.
    The pair's second segment is of token type 1, as the folder's tokenizer makes it."""
    import transformers
    from encoders import make_cross_encoder
    from gguf_tools import convert

    folder = make_cross_encoder(tmp_path / "bert-rr", "bert")
    ours = EncoderEngine.from_pretrained(convert(folder, tmp_path / "bert-rr.gguf"))
    assert ours.config.pooling == "rank" and ours.model.head.dense is None
    pairs = ours.encode_pairs("the slot cache", TEXTS[:3])
    assert pairs == EncoderEngine.from_pretrained(folder).encode_pairs("the slot cache", TEXTS[:3])
    assert all(1 in types for _, types in pairs)
    hf = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    expected = []
    with torch.no_grad():
        for ids, types in pairs:
            state = hf.bert(torch.tensor([ids]), token_type_ids=torch.tensor([types])).last_hidden_state[0, 0]
            expected.append(hf.classifier(state))
    got = torch.stack(ours.embed([p[0] for p in pairs], "rank", [p[1] for p in pairs]))
    torch.testing.assert_close(got, torch.stack(expected), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("outtype", ["q8_0", "f16"])
def test_a_quantized_gguf_encoder_computes_on_its_blocks(tmp_path, outtype):
    """A Q8_0 or F16 file's linear and embedding weights stay in the file's blocks (Q8_0
    repacked for the integer kernel, 8-bit activations as llama.cpp's), never as a float32
    copy; its vectors are the float32 file's within that rounding."""
    from gguf_tools import convert

    from engine.kernels.block_model import weight_bytes_by_type

    folder = make_bert_embedder(tmp_path / "bert", pooling="mean", normalize=True, intermediate_size=256)
    exact = EncoderEngine.from_pretrained(convert(folder, tmp_path / "f32.gguf"), normalize=True)
    ours = EncoderEngine.from_pretrained(convert(folder, tmp_path / f"{outtype}.gguf", outtype), normalize=True)
    kind = outtype.upper()
    by_type = weight_bytes_by_type(ours.model)
    n_linear = sum(m.weight.numel() for m in exact.model.modules() if isinstance(m, torch.nn.Linear))
    bytes_per_value = {"Q8_0": 34 / 32, "F16": 2}[kind]
    assert by_type[kind] >= n_linear * bytes_per_value  # every linear weight (and tables) in blocks
    assert by_type["F32"] < n_linear  # no float32 copy: only norms, biases, small tables
    layer = ours.model.encoder.layer[0].intermediate.dense
    assert layer.parts[0].qtype.name == kind and layer.packed is (kind == "Q8_0")
    ids = ours.encode(TEXTS)
    got, expected = torch.stack(ours.embed(ids)), torch.stack(exact.embed(ids))
    cos = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert (cos > 0.999).all(), cos


@pytest.mark.parametrize("family", ["nomic", "modernbert"])
def test_rotary_encoders_embed_as_sentence_transformers(tmp_path, family):
    """nomic-bert (fused q/k/v, rotary, SwiGLU, post-norm; its config as published) and
    ModernBERT (pre-norm, global and local layers with their own rotary bases, GeGLU):
    the folders' vectors equal sentence-transformers' own, batched or alone, on inputs
    longer than ModernBERT's local window."""
    from encoders import make_modernbert_embedder, make_nomic_embedder
    from sentence_transformers import SentenceTransformer

    make = {"nomic": make_nomic_embedder, "modernbert": make_modernbert_embedder}[family]
    folder = make(tmp_path / family)
    assert is_encoder(folder)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    engine = EncoderEngine.from_pretrained(folder, batch_tokens=64)
    ids = engine.encode(TEXTS)
    assert max(map(len, ids)) > 16  # past the local window
    got = _batched_as_alone(engine, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_a_gguf_nomic_bert_file_gives_its_folders_vectors(tmp_path):
    """The pinned converter's ``nomic-bert`` file (fused q/k/v as ``attn_qkv``, the gate
    and up halves as ``ffn_gate`` / ``ffn_up``, the rotary base): the folder's tokens and
    vectors."""
    from encoders import make_nomic_embedder
    from gguf_tools import convert

    folder = make_nomic_embedder(tmp_path / "nomic")
    gguf_file = convert(folder, tmp_path / "nomic.gguf")
    assert is_encoder(gguf_file)
    ours, theirs = EncoderEngine.from_pretrained(gguf_file, normalize=True), EncoderEngine.from_pretrained(folder)
    assert ours.config.pooling == "mean"
    assert ours.encode(TEXTS[:2]) == theirs.encode(TEXTS[:2])
    ids = theirs.encode(TEXTS)
    torch.testing.assert_close(torch.stack(ours.embed(ids)), torch.stack(theirs.embed(ids)), atol=1e-5, rtol=1e-4)


def test_pooling_none_gives_every_tokens_vector_as_sentence_transformers(tmp_path):
    """llama-server's /embedding with pooling none: one vector per token, unnormalized:
    sentence-transformers' ``token_embeddings``."""
    from sentence_transformers import SentenceTransformer

    folder = make_bert_embedder(tmp_path / "bert", pooling="mean", normalize=True)
    model = SentenceTransformer(str(folder), device="cpu")
    expected = model.encode(TEXTS[:2], output_value="token_embeddings", convert_to_tensor=False)
    engine = EncoderEngine.from_pretrained(folder, normalize=False)
    got = engine.embed(engine.encode(TEXTS[:2]), "none")
    for mine, theirs in zip(got, expected):
        assert mine.shape == theirs.shape and mine.shape[0] > 2
        torch.testing.assert_close(mine, theirs.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_modernbert_cross_encoder_scores_as_transformers(tmp_path, pooling):
    """ModernBertForSequenceClassification: its ``classifier_pooling`` over each pair's own
    tokens (padding in the batch left out), then the head (dense, GELU, LayerNorm) and
    ``classifier``: transformers' logits on the same pairs, from the folder and from the
    converter's file (``cls``, ``cls.norm``, ``cls.output``, its classifier pooling type)."""
    import transformers
    from encoders import write_modernbert_bytes
    from gguf_tools import convert

    folder = tmp_path / "mb-rr"
    ids = write_modernbert_bytes(folder)
    torch.manual_seed(0)
    fields = dict(vocab_size=ids["size"], hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, local_attention=8, pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
                  sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
                  max_position_embeddings=128, num_labels=1, classifier_pooling=pooling)  # fmt: skip
    hf = transformers.ModernBertForSequenceClassification(transformers.ModernBertConfig(**fields))
    jitter(hf)
    hf.save_pretrained(folder)
    ours = EncoderEngine.from_pretrained(folder)
    assert ours.config.pooling == "rank"
    pairs = ours.encode_pairs("the slot cache", TEXTS[:2] + SCRIPTS)
    with torch.no_grad():
        expected = torch.stack([hf.eval()(torch.tensor([p])).logits[0] for p, _ in pairs])
    from_file = EncoderEngine.from_pretrained(convert(folder, tmp_path / "mb-rr.gguf", pre="modern-bert"))
    for engine in (ours, from_file):
        assert engine.encode_pairs("the slot cache", TEXTS[:2] + SCRIPTS) == pairs
        got = torch.stack(engine.embed([p[0] for p in pairs], "rank", [p[1] for p in pairs]))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_a_gguf_modernbert_file_gives_its_folders_tokens_and_vectors(tmp_path):
    """The pinned converter's ``modern-bert`` file (byte-level BPE, [CLS]/[SEP] from its
    flags, global and local rotary bases, the window and its pattern, norm biases): the
    folder's tokens, pairs and vectors."""
    from encoders import make_modernbert_embedder
    from gguf_tools import convert, reader_of

    folder = make_modernbert_embedder(tmp_path / "mb", tokenizer="bytes")
    gguf_file = convert(folder, tmp_path / "mb.gguf", pre="modern-bert")
    assert is_encoder(gguf_file) and reader_of(gguf_file).fields["tokenizer.ggml.pre"].contents() == "modern-bert"
    ours, theirs = EncoderEngine.from_pretrained(gguf_file, "mean", True), EncoderEngine.from_pretrained(folder)
    texts = [t for t in TEXTS + SCRIPTS if len(theirs.encode([t])[0]) < 48]  # the folder cuts at 48, the file at 128
    assert ours.encode(texts) == theirs.encode(texts)
    assert ours.encode_pairs("a query", texts[:2]) == theirs.encode_pairs("a query", texts[:2])
    ids = theirs.encode(texts)
    assert max(map(len, ids)) > 16  # past the local window
    torch.testing.assert_close(torch.stack(ours.embed(ids)), torch.stack(theirs.embed(ids)), atol=1e-5, rtol=1e-4)


def test_embedding_gemma_embeds_as_sentence_transformers(tmp_path):
    """EmbeddingGemma (Gemma 3 layers attending both ways, local ones only within their
    window; mean pooling, two Dense modules, Normalize): sentence-transformers' vectors,
    of the last Dense module's size, batched or alone, on inputs longer than the local
    window; its config as transformers 4 writes it (``rope_theta``, ``rope_local_base_freq``,
    no ``layer_types``) gives the same. A ``Gemma3TextModel`` without
    ``use_bidirectional_attention`` is no encoder."""
    import json
    import shutil

    from encoders import make_embedding_gemma
    from sentence_transformers import SentenceTransformer

    bases = {"full_attention": 200_000.0, "sliding_attention": 20_000.0}  # not the defaults: each must be read
    ropes = {kind: {"rope_type": "default", "rope_theta": base} for kind, base in bases.items()}
    folder = make_embedding_gemma(tmp_path / "eg", rope_parameters=ropes)
    assert is_encoder(folder)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS + SCRIPTS, convert_to_tensor=True)
    engine = EncoderEngine.from_pretrained(folder, batch_tokens=64)
    assert engine.config.hidden_size == expected.shape[1] == 48  # the Dense modules' output, not the model's 64
    ids = engine.encode(TEXTS + SCRIPTS)
    assert max(map(len, ids)) > 16  # past the local window
    got = _batched_as_alone(engine, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    old = shutil.copytree(folder, tmp_path / "eg-v4")
    raw = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "dtype"):
        raw.pop(key)
    raw |= {"rope_theta": bases["full_attention"], "rope_local_base_freq": bases["sliding_attention"],
            "rope_scaling": None, "sliding_window_pattern": 6, "torch_dtype": "float32"}  # fmt: skip
    (old / "config.json").write_text(json.dumps(raw))
    torch.testing.assert_close(torch.stack(EncoderEngine.from_pretrained(old).embed(ids)), got, atol=1e-6, rtol=1e-6)
    causal = tmp_path / "causal"
    causal.mkdir()
    raw = json.loads((folder / "config.json").read_text()) | {"use_bidirectional_attention": False}
    (causal / "config.json").write_text(json.dumps(raw))
    shutil.copy(folder / "model.safetensors", causal)
    assert not is_encoder(causal)


def test_a_gguf_embedding_gemma_file_gives_its_folders_tokens_and_vectors(embedding_gemma_files):
    """The pinned converter's ``gemma-embedding`` file (Gemma's SentencePiece BPE, <bos>
    and <eos> from its flags, norms stored as 1 + w, the symmetric window): written with
    ``--sentence-transformers-dense-modules``, the folder's tokens and vectors (Q8_0:
    within its rounding, on its blocks); written without, the vectors before the Dense
    modules, as llama.cpp computes them from that file."""
    folder, full, bare, q8 = (embedding_gemma_files[k] for k in ("folder", "full", "bare", "q8"))
    theirs = EncoderEngine.from_pretrained(folder)
    texts = [t for t in TEXTS + SCRIPTS if len(theirs.encode([t])[0]) < 48]  # the folder cuts at 48, the file at 128
    ids = theirs.encode(texts)
    assert max(map(len, ids)) > 16  # past the local window
    expected = torch.stack(theirs.embed(ids))
    ours = EncoderEngine.from_pretrained(full, normalize=True)
    assert is_encoder(full) and ours.config.pooling == "mean" and ours.config.hidden_size == 48
    assert ours.encode(texts) == ids
    torch.testing.assert_close(torch.stack(ours.embed(ids)), expected, atol=1e-5, rtol=1e-4)
    quantized = EncoderEngine.from_pretrained(q8, normalize=True)
    assert quantized.model.layers[0].mlp.up_proj.parts[0].qtype.name == "Q8_0"
    cos = torch.nn.functional.cosine_similarity(torch.stack(quantized.embed(ids)), expected, dim=-1)
    assert (cos > 0.998).all(), cos  # six random layers: Q8_0 weights and 8-bit activations, as llama.cpp's
    plain = EncoderEngine.from_pretrained(bare, normalize=True)
    assert plain.config.hidden_size == 64 and plain.dense is None
    theirs.dense = None  # the folder's model, mean-pooled and normalized, no Dense modules
    torch.testing.assert_close(torch.stack(plain.embed(ids)), torch.stack(theirs.embed(ids)), atol=1e-5, rtol=1e-4)


def test_embedding_gemma2_embeds_as_sentence_transformers_and_transformers(tmp_path):
    """EmbeddingGemma 2's text path (Gemma 4-style layers attending both ways: local ones
    within their radius, global ones with their own head size and k/v heads; per-layer
    embeddings; each layer's scalar; the projection to ``embedding_dim``): its text model
    saved by sentence-transformers gives the library's vectors, batched or alone; the
    composite ``EmbeddingGemma2Model`` folder (tensors under ``language_model.``) gives
    transformers' last hidden states, mean-pooled and normalized."""
    from encoders import make_embedding_gemma2
    from sentence_transformers import SentenceTransformer

    folder = make_embedding_gemma2(tmp_path / "eg2")
    assert is_encoder(folder)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS + SCRIPTS, convert_to_tensor=True)
    engine = EncoderEngine.from_pretrained(folder, batch_tokens=64)
    assert engine.config.hidden_size == expected.shape[1] == 48 and engine.config.pooling == "mean"
    ids = engine.encode(TEXTS + SCRIPTS)
    assert max(map(len, ids)) > 16  # past the local radius
    got = _batched_as_alone(engine, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)

    folder, model = make_embedding_gemma2(tmp_path / "eg2-full", composite=True)
    assert is_encoder(folder)
    engine = EncoderEngine.from_pretrained(folder)
    with torch.no_grad():
        states = [model(input_ids=torch.tensor([one])).last_hidden_state[0] for one in ids]  # [T, 48] each
    expected = torch.stack([torch.nn.functional.normalize(s.mean(0), dim=-1) for s in states])
    torch.testing.assert_close(torch.stack(engine.embed(ids)), expected, atol=1e-5, rtol=1e-4)
    (folder / "modules.json").unlink()  # no sentence-transformers modules: the model card's mean pooling
    assert EncoderEngine.from_pretrained(folder).config.pooling == "mean"


def test_an_encoders_window_masks_take_a_byte_an_entry():
    """ModernBERT's and EmbeddingGemma's masks (global: every real key; local: the real
    keys within the radius): one input of 8,192 tokens takes 64 MB of masks, not the
    512 MB two float32 [B, 1, T, T] masks took; and they say what they said."""
    from engine.models.encoder_base import window_masks

    full, local = window_masks(torch.tensor([8192]), 8192, 64)
    assert sum(m.numel() * m.element_size() for m in (full, local)) <= 8192 * 8192 + 8192
    lengths, t, radius = torch.tensor([5, 3]), 5, 1
    full, local = (m.expand(2, 1, t, t) for m in window_masks(lengths, t, radius))
    for b, n in enumerate(lengths.tolist()):
        for q in range(t):
            for k in range(t):
                assert bool(full[b, 0, q, k]) == (k < n)
                assert bool(local[b, 0, q, k]) == (k < n and abs(q - k) <= radius)
