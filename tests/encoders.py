"""Tiny encoder checkpoints for the retrieval tests (issue 54), written as
sentence-transformers saves them (modules.json, a pooling config, Normalize,
sentence_bert_config.json), with a WordPiece tokenizer built by ``tokenizers``."""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from checkpoints import jitter

BERT_TINY = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=64)  # fmt: skip
WORDS = ["slot", "cache", "query", "window", "file", "the", "a", "of", "and", "retrieval"]


def write_wordpiece(folder: Path) -> int:
    """A lower-casing WordPiece tokenizer ([CLS] text [SEP]); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = specials + WORDS + list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    pieces += list(string.digits + string.punctuation)
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.decoder = decoders.WordPiece()
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512,
           **{f"{k}_token": f"[{k.upper()}]" for k in ("pad", "unk", "cls", "sep", "mask")}}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


def write_unigram(folder: Path) -> int:
    """XLM-RoBERTa's tokenizer as published: a SentencePiece Unigram model (NFKC by its
    precompiled charsmap) trained on ``spm_corpus`` as ``sentencepiece.bpe.model``, and
    the tokenizer.json transformers converts it to (fairseq's ids: <s> <pad> </s> <unk>
    first, <mask> last; <s> text </s>). Returns the vocabulary size."""
    import io

    import sentencepiece as spm
    from checkpoints import spm_corpus
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(spm_corpus() + WORDS * 20), model_writer=model, model_type="unigram", vocab_size=400,
        minloglevel=2, num_threads=1,
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    tok = AutoTokenizer.from_pretrained(folder)  # converted from the SentencePiece model
    tok.model_max_length = 512
    tok.save_pretrained(folder)
    return len(tok)


def make_bert_embedder(
    folder: Path, pooling: str = "mean", normalize: bool = True, seed: int = 0, kind: str = "bert", **overrides
) -> Path:
    """A random tiny BERT (``kind`` "bert", WordPiece) or XLM-RoBERTa ("xlm-roberta",
    Unigram; positions after the padding id) saved by sentence-transformers with
    ``pooling`` (mean, cls, lasttoken) and, with ``normalize``, a Normalize module."""
    import transformers
    from sentence_transformers import SentenceTransformer, models

    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "bert":
        config = transformers.BertConfig(**{**BERT_TINY, "vocab_size": write_wordpiece(base), **overrides})
        model = transformers.BertModel(config, add_pooling_layer=False)
    else:
        fields = {**BERT_TINY, "vocab_size": write_unigram(base), "max_position_embeddings": 66, "pad_token_id": 1}
        fields.update(bos_token_id=0, eos_token_id=2, type_vocab_size=1, **overrides)
        config = transformers.XLMRobertaConfig(**fields)
        model = transformers.XLMRobertaModel(config, add_pooling_layer=False)
    jitter(model)
    model.save_pretrained(base)
    modules = [models.Transformer(str(base), max_seq_length=48), models.Pooling(config.hidden_size, pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def make_cross_encoder(folder: Path, kind: str = "bert", seed: int = 0, **overrides) -> Path:
    """A random tiny cross-encoder reranker (one label) as a Hugging Face folder:
    ``BertForSequenceClassification`` (WordPiece; its pooler feeds the classifier) or
    ``XLMRobertaForSequenceClassification`` (Unigram; dense, tanh, out_proj)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "bert":
        fields = {**BERT_TINY, "vocab_size": write_wordpiece(folder), "num_labels": 1, **overrides}
        config = transformers.BertConfig(**fields)
        model = transformers.BertForSequenceClassification(config)
    else:
        fields = {**BERT_TINY, "vocab_size": write_unigram(folder), "max_position_embeddings": 66, "pad_token_id": 1}
        fields.update(bos_token_id=0, eos_token_id=2, type_vocab_size=1, num_labels=1, **overrides)
        model = transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(**fields))
    jitter(model)
    model.save_pretrained(folder)
    if kind == "bert":  # as transformers saves it (its special tokens named: the converter reads them)
        transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)
    return folder


NOMIC_PUBLISHED = {  # nomic-embed-text-v1.5's config.json fields (its remote code's names)
    "activation_function": "swiglu", "causal": False, "prenorm": False, "qkv_proj_bias": False,
    "mlp_fc1_bias": False, "mlp_fc2_bias": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None, "n_positions": 8192, "max_trained_positions": 2048, "rotary_emb_base": 1000,
}  # fmt: skip


def make_nomic_embedder(folder: Path, seed: int = 0) -> Path:
    """A random tiny nomic-bert (nomic-embed-text's layout: fused q/k/v, rotary, SwiGLU,
    post-norm, no biases) saved by sentence-transformers with mean pooling and Normalize;
    its config.json carries the published fields (``n_embd``, ``n_head``, ...,
    ``activation_function``) beside transformers 5's, as llama.cpp's converter reads
    the former and transformers the latter."""
    import transformers
    from sentence_transformers import SentenceTransformer, models

    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    vocab = write_wordpiece(base)
    config = transformers.NomicBertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=128, max_position_embeddings=2048)  # fmt: skip
    model = transformers.NomicBertModel(config)
    jitter(model)
    model.save_pretrained(base)
    raw = json.loads((base / "config.json").read_text())
    raw |= NOMIC_PUBLISHED | {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 128, "layer_norm_epsilon": 1e-12}
    (base / "config.json").write_text(json.dumps(raw))
    modules = [models.Transformer(str(base), max_seq_length=48), models.Pooling(64, "mean"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


MODERNBERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")


def write_modernbert_bytes(folder: Path) -> dict[str, int]:
    """ModernBERT's kind of tokenizer as published: a byte-level BPE trained with its own
    split (llama.cpp's ``modern-bert``), [CLS] text [SEP] (pairs: [CLS] a [SEP] b [SEP]),
    the generic tokenizer class. Returns the special tokens' ids and, under ``size``, the
    vocabulary's size."""
    from family_tokenizers import write_family_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_family_tokenizer(folder, "modern-bert", 400, MODERNBERT_SPECIALS)
    tok = json.loads((folder / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    a, b = ({"Sequence": {"id": s, "type_id": 0}} for s in "AB")
    cls, sep = ({"SpecialToken": {"id": t, "type_id": 0}} for t in ("[CLS]", "[SEP]"))
    specials = {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")}
    tok["post_processor"] = {"type": "TemplateProcessing", "single": [cls, a, sep], "pair": [cls, a, sep, b, sep],
                             "special_tokens": specials}  # fmt: skip
    for added in tok["added_tokens"]:
        added["special"] = True
        added["lstrip"] = added["content"] == "[MASK]"  # as ModernBERT's tokenizer.json has it
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return {**ids, "size": len(tok["model"]["vocab"])}


def make_modernbert_embedder(folder: Path, seed: int = 0, tokenizer: str = "wordpiece", **overrides) -> Path:
    """A random tiny ModernBERT (4 layers: global, local, local, global; a local window
    of 8 tokens, so inputs longer than it see the difference) saved by
    sentence-transformers with mean pooling and Normalize; ``tokenizer`` "bytes": a
    byte-level BPE, which the GGUF converter needs."""
    import transformers
    from sentence_transformers import SentenceTransformer, models

    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if tokenizer == "bytes":
        ids = write_modernbert_bytes(base)
        vocab, pad, cls, sep = ids["size"], ids["[PAD]"], ids["[CLS]"], ids["[SEP]"]
    else:
        vocab, pad, cls, sep = write_wordpiece(base), 0, 2, 3
    fields = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  local_attention=8, global_attn_every_n_layers=3, pad_token_id=pad, bos_token_id=cls,
                  eos_token_id=sep, cls_token_id=cls, sep_token_id=sep, max_position_embeddings=128,
                  norm_bias=True)  # fmt: skip
    model = transformers.ModernBertModel(transformers.ModernBertConfig(**{**fields, **overrides}))
    jitter(model)
    model.save_pretrained(base)
    modules = [models.Transformer(str(base), max_seq_length=48), models.Pooling(64, "mean"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def write_gemma_spm(folder: Path, symbols: tuple[str, ...] = (), add_eos: bool = True) -> int:
    """Gemma's tokenizer as published: a SentencePiece BPE (byte fallback, no space in
    front, digits split; <pad> <eos> <bos> <unk> first, then ``symbols``: the chat
    markers) as ``tokenizer.model``, and the tokenizer.json transformers converts it to,
    adding <bos> and (``add_eos``: as EmbeddingGemma's does; Gemma's chat models do not)
    <eos>. Returns the vocabulary size."""
    import io

    import sentencepiece as spm
    from checkpoints import spm_corpus
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(spm_corpus() + WORDS * 20), model_writer=model, model_type="bpe", vocab_size=600,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>", minloglevel=2, num_threads=1,
        user_defined_symbols=list(symbols),
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    cfg = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": add_eos, "bos_token": "<bos>",
           "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = AutoTokenizer.from_pretrained(folder)  # converted from the SentencePiece model
    tok.save_pretrained(folder)
    return len(tok)


def make_embedding_gemma(folder: Path, seed: int = 0, dense: tuple[int, int] = (96, 48), **overrides) -> Path:
    """A random tiny EmbeddingGemma: a ``Gemma3TextModel`` attending both ways (six
    layers, the sixth global; a local window of 8, so tokens further than 4 apart do not
    see each other in local layers), saved by sentence-transformers as published: mean
    pooling, two Dense modules without bias or activation (hidden -> ``dense[0]`` ->
    ``dense[1]``), Normalize; with ``tokenizer.model`` (the GGUF converter reads it).
    ``overrides``: Gemma3TextConfig fields over the tiny ones."""
    import shutil

    import transformers
    from sentence_transformers import SentenceTransformer, models

    base = folder.parent / f"{folder.name}-base"
    vocab = write_gemma_spm(base)
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                  use_bidirectional_attention=True, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
                  bos_token_id=2, architectures=["Gemma3TextModel"])  # fmt: skip
    fields.update(overrides)
    hidden = fields["hidden_size"]
    model = transformers.Gemma3TextModel(transformers.Gemma3TextConfig(**fields))
    jitter(model)
    model.save_pretrained(base)
    identity = torch.nn.Identity()
    modules = [
        models.Transformer(str(base), max_seq_length=48),
        models.Pooling(hidden, "mean"),
        models.Dense(hidden, dense[0], bias=False, activation_function=identity),
        models.Dense(dense[0], dense[1], bias=False, activation_function=identity),
        models.Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    shutil.copy(base / "tokenizer.model", folder / "tokenizer.model")
    return folder


GEMMA2_TINY = dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                   sliding_window=4, hidden_size_per_layer_input=16, embedding_dim=48, max_position_embeddings=128,
                   sliding_window_pattern=2)  # fmt: skip


def make_embedding_gemma2(folder: Path, seed: int = 0, composite: bool = False):
    """A random tiny EmbeddingGemma 2 (four layers, local and global by turns, the global
    ones with twice the head size and one k/v head; a local radius of 4; per-layer
    embeddings; 64 -> 48 projection) with Gemma 4's tokenizer. ``composite`` False: its
    text model saved by sentence-transformers (mean pooling, Normalize), returns the
    folder; True: the ``EmbeddingGemma2Model`` as transformers saves it (tensors under
    ``language_model.``) with the same sentence-transformers modules beside it, returns
    (folder, the transformers model)."""
    import transformers
    from checkpoints import write_gemma4_tokenizer
    from sentence_transformers import SentenceTransformer, models

    base = folder if composite else folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    write_gemma4_tokenizer(base, GEMMA2_TINY["vocab_size"])
    torch.manual_seed(seed)
    text = transformers.EmbeddingGemma2TextConfig(**GEMMA2_TINY)
    model = (
        transformers.EmbeddingGemma2Model(transformers.EmbeddingGemma2Config(text_config=text))
        if composite
        else transformers.EmbeddingGemma2TextModel(text)
    )
    jitter(model, buffers=("layer_scalar",))  # each layer's output scale: a saved buffer
    model.save_pretrained(base)
    if not composite:
        modules = [models.Transformer(str(base), max_seq_length=48), models.Pooling(48, "mean"), models.Normalize()]
        SentenceTransformer(modules=modules, device="cpu").save(str(folder))
        return folder
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))  # fmt: skip
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 48,
                                                                 "pooling_mode_mean_tokens": True}))  # fmt: skip
    (folder / "2_Normalize").mkdir()
    return folder, model.eval()
