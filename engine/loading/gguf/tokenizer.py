"""A GGUF file's tokenizer rebuilt as a ``tokenizers`` tokenizer (the tokenizer.json a
Hugging Face folder would carry), from the metadata llama.cpp's converter writes:
``tokenizer.ggml.model`` (``gpt2``: byte-pair merges, split as ``.pre`` names, every
name the pinned llama.cpp knows: engine/text/splits.py; ``llama``: SentencePiece BPE
with scores and byte fallback; ``gemma4``: BPE with merges over raw UTF-8;
``whitespace``: BPE over raw UTF-8 cut at whitespace), ``.tokens``, ``.scores``,
``.token_type``, ``.merges``, ``.add_space_prefix``, the special token ids and
``tokenizer.chat_template``. The other vocabulary kinds llama.cpp reads are refused by
name (``REFUSED``)."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.text.splits import SPLITS, Split, split_of
from engine.text.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

# The vocabulary kinds llama.cpp reads that slotserve does not build for a decoder, and why.
REFUSED = {
    "bert": "a WordPiece vocabulary: BERT-style encoders are served as encoders, not for generation",
    "t5": "a SentencePiece Unigram vocabulary: T5-style models are served only as XLM-RoBERTa encoders",
    "rwkv": "RWKV's greedy trie vocabulary: RWKV models are not served",
    "plamo2": "PLaMo 2's own vocabulary: PLaMo models are not served",
    "hybriddna": "a DNA k-mer vocabulary: DNA models are not served",
    "none": "the file carries no vocabulary",
    "no_vocab": "the file carries no vocabulary",
    "test": "llama.cpp's internal test vocabulary",
}
SUPPORTED = ("gpt2", "llama", "gemma4", "whitespace")


def build_tokenizer(fields: dict[str, Any], where: str) -> HFTokenizer:
    """Raises CheckpointError for a vocabulary kind or pre-tokenizer it cannot rebuild,
    naming it and the reason."""
    model = fields.get("tokenizer.ggml.model")
    if model not in SUPPORTED:
        why = REFUSED.get(model, f"not a vocabulary kind llama.cpp knows (supported: {', '.join(SUPPORTED)})")
        raise CheckpointError(f"{where}: GGUF tokenizer model '{model}' is not supported: {why}")
    tokens: list[str] = fields.get("tokenizer.ggml.tokens") or []
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if model == "llama":
        spec = _sentencepiece_spec(fields, tokens, types)
    else:
        # llama.cpp splits a gemma4 or whitespace vocabulary its own way, whatever the file's pre name
        pre = model if model in ("gemma4", "whitespace") else fields.get("tokenizer.ggml.pre")
        split = split_of(pre)
        if split is None:
            raise CheckpointError(
                f"{where}: GGUF pre-tokenizer '{pre}' is not one the pinned llama.cpp knows ({len(SPLITS)} names)"
            )
        spec = _merges_spec(fields, tokens, types, split)
    try:
        return HFTokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises plain Exceptions
        raise CheckpointError(f"{where}: cannot rebuild the tokenizer from GGUF metadata: {exc}") from exc


def _added(
    tokens: list[str], types: list[int], kinds: tuple[int, ...], strips: dict[int, str] | None = None
) -> list[dict]:
    """Tokens matched whole before the model runs: special unless user-defined. Unused
    tokens (Gemma's ``<unusedN>``) are special too, as in the checkpoints' tokenizer.json:
    a model that emits one prints nothing, as llama-server prints nothing for it.
    ``strips``: id -> "lstrip" / "rstrip", the whitespace a token swallows (``strip_rules``)."""
    strips = strips or {}
    return [
        {"id": i, "content": t, "single_word": False, "lstrip": strips.get(i) == "lstrip",
         "rstrip": strips.get(i) == "rstrip", "normalized": False, "special": types[i] != USER_DEFINED}
        for i, t in enumerate(tokens)
        if types[i] in kinds
    ]  # fmt: skip


def strip_rules(fields: dict[str, Any], tokens: list[str], types: list[int]) -> dict[int, str]:
    """The whitespace llama.cpp lets some special tokens swallow, by the file's name (the
    GGUF carries no per-token attribute; llama-vocab.cpp sets them by name): Phi-3's
    special tokens take the whitespace after them (but ``<unk>``, ``<s>``,
    ``<|endoftext|>``), the ``<mask>`` of jina-v2 and ``[MASK]`` of ModernBERT the
    whitespace before."""
    name = str(fields.get("general.name") or "").lower()
    pre = str(fields.get("tokenizer.ggml.pre") or "")
    arch = str(fields.get("general.architecture") or "")
    ids = {t: i for i, t in enumerate(tokens)}
    if any(k in pre for k in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or arch in (
        "nomic-bert-moe",
        "jina-bert-v3",
    ):
        return {ids["<mask>"]: "lstrip"} if "<mask>" in ids else {}
    if "phi-3" in name or "phi3" in name:
        special = (CONTROL, USER_DEFINED, UNKNOWN)
        rules = {i: "rstrip" for i, kind in enumerate(types) if kind in special}
        rules |= {ids["</s>"]: "rstrip"} if "</s>" in ids else {}
        return {i: r for i, r in rules.items() if tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")}
    if "modern-bert" in name:
        return {ids["[MASK]"]: "lstrip"} if "[MASK]" in ids else {}
    return {}


def _spec(added: list[dict], pre_tokenizer: dict | None, decoder: dict, model: dict, normalizer=None) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": {"dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None, **model},
    }


def _merges_spec(fields: dict[str, Any], tokens: list[str], types: list[int], split: Split) -> dict:
    """Byte-pair merges over the split's pieces: GPT-2's byte-level alphabet, or raw
    UTF-8 with ``<0xNN>`` byte tokens for characters outside the vocabulary (Gemma 4's
    spaces written as U+2581)."""
    merges: list[str] = fields.get("tokenizer.ggml.merges") or []
    bytes_ = split.alphabet == "bytes"
    model = {
        "type": "BPE",
        "unk_token": None,
        "fuse_unk": False,
        "byte_fallback": not bytes_,
        "ignore_merges": split.ignore_merges,
        "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": [m.split(" ", 1) for m in merges],
    }
    if bytes_:
        decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        added = _added(tokens, types, (CONTROL, USER_DEFINED, UNUSED), strip_rules(fields, tokens, types))
    else:
        steps = [{"type": "ByteFallback"}, {"type": "Fuse"}]
        if split.alphabet == "escaped":
            steps.insert(0, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "})
        decoder = {"type": "Sequence", "decoders": steps}
        added = _added(tokens, types, (UNKNOWN, CONTROL, USER_DEFINED, UNUSED), strip_rules(fields, tokens, types))
    return _spec(added, split.pre_tokenizer(), decoder, model, split.normalizer())


def _sentencepiece_spec(fields: dict[str, Any], tokens: list[str], types: list[int]) -> dict:
    """SentencePiece BPE as transformers converts a ``tokenizer.model``: spaces written
    as U+2581 (and one put in front when ``add_space_prefix``), merges ranked by the
    score of the piece they make, characters outside the vocabulary as ``<0xNN>``."""
    scores: list[float] = fields.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
    unk = fields.get("tokenizer.ggml.unknown_token_id")
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t: i for t, i in vocab.items() if types[i] in (NORMAL, USER_DEFINED) and len(t) > 1}
    merges = []  # (rank key, left, right): pieces with higher scores merge first
    for piece, i in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append(((-scores[i], i, vocab[left], vocab[right]), left, right))
    merges.sort()
    # a space in front of the text and of every piece of text after a special token, even
    # one that starts with a space (llama.cpp's SentencePiece tokenizer; transformers'
    # legacy Llama tokenizer.json: Prepend and Replace normalizers, applied per piece of
    # text between special tokens); the text is not split before the merges
    escape = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = (
        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, escape]} if prefix else escape
    )
    steps = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    model = {
        "type": "BPE",
        "unk_token": tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None,
        "fuse_unk": True,
        "byte_fallback": True,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": [[left, right] for _, left, right in merges],
    }
    added = _added(tokens, types, (UNKNOWN, CONTROL, USER_DEFINED, UNUSED), strip_rules(fields, tokens, types))
    return _spec(added, None, {"type": "Sequence", "decoders": steps}, model, normalizer)


def gguf_tokenizer(checkpoint) -> Tokenizer:
    """The tokenizer of a GGUF file (``GGUFCheckpoint``): rebuilt from its metadata,
    with its special tokens, ``add_bos`` and chat template."""
    fields = checkpoint.fields
    hf = build_tokenizer(fields, str(checkpoint.path))
    tokens = fields.get("tokenizer.ggml.tokens") or []

    def text(key: str) -> str | None:
        i = fields.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    eos = {fields[k] for k in keys if isinstance(fields.get(k), int)}
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
    bos, eos_text = text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id")
    template = fields.get("tokenizer.chat_template")
    return Tokenizer(hf, bos, eos_text, add_bos, eos, template, fim_fields=fields, add_eos=add_eos)
