"""Tiny encoder checkpoints for the retrieval tests (issue 54), written as
sentence-transformers saves them (modules.json, a pooling config, Normalize,
sentence_bert_config.json), with a WordPiece tokenizer built by ``tokenizers``."""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

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
    """A SentencePiece-style Unigram tokenizer as XLM-RoBERTa's (<s> text </s>, the
    metaspace pre-tokenizer); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = ["\u2581" + w for w in WORDS] + list(string.ascii_letters + string.digits + string.punctuation)
    pieces += ["\u2581" + c for c in string.ascii_lowercase] + ["\u2581"]
    vocab = [(p, 0.0) for p in specials] + [(p, -float(len(p) == 1) - 1.0) for p in dict.fromkeys(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, "bos_token": "<s>", "eos_token": "</s>",
           "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
           "mask_token": "<unk>"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


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
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(base)
    modules = [models.Transformer(str(base), max_seq_length=48), models.Pooling(config.hidden_size, pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def make_cross_encoder(folder: Path, kind: str = "bert", seed: int = 0) -> Path:
    """A random tiny cross-encoder reranker (one label) as a Hugging Face folder:
    ``BertForSequenceClassification`` (WordPiece; its pooler feeds the classifier) or
    ``XLMRobertaForSequenceClassification`` (Unigram; dense, tanh, out_proj)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "bert":
        config = transformers.BertConfig(**{**BERT_TINY, "vocab_size": write_wordpiece(folder), "num_labels": 1})
        model = transformers.BertForSequenceClassification(config)
    else:
        fields = {**BERT_TINY, "vocab_size": write_unigram(folder), "max_position_embeddings": 66, "pad_token_id": 1}
        fields.update(bos_token_id=0, eos_token_id=2, type_vocab_size=1, num_labels=1)
        model = transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(**fields))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return folder
