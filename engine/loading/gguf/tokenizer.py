"""A GGUF file's tokenizer rebuilt as a ``tokenizers`` tokenizer (the tokenizer.json a
Hugging Face folder would carry), from the metadata llama.cpp's converter writes:
``tokenizer.ggml.model`` (``gpt2``: byte-level BPE with merges; ``llama``: SentencePiece
BPE with scores and byte fallback; ``gemma4``: BPE with merges over raw UTF-8), ``.pre``
(which pre-tokenizer split a byte-level model was trained with), ``.tokens``,
``.scores``, ``.token_type``, ``.merges``, ``.add_space_prefix``, the special token ids
and ``tokenizer.chat_template``."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.text.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

# Splits before the byte-level step, by llama.cpp's pre-tokenizer name (the regexes of
# the models' own tokenizer.json files). None: GPT-2's split, done by ByteLevel itself.
_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = _WORDS + r"\p{N}{1,3}" + _REST  # numbers in runs of up to 3 digits
QWEN2 = _WORDS + r"\p{N}" + _REST  # one digit at a time
PRE_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt-2": None,
    "gpt2": None,
    "llama-bpe": LLAMA3,
    "llama3": LLAMA3,
    "smaug-bpe": LLAMA3,
    "qwen2": QWEN2,
    "deepseek-r1-qwen": QWEN2,
}


def build_tokenizer(fields: dict[str, Any], where: str) -> HFTokenizer:
    model = fields.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama", "gemma4"):
        kind = f"GGUF tokenizer model '{model}'"
        raise CheckpointError(
            f"{where}: {kind} is not supported (only gpt2, byte-level BPE; llama, SentencePiece; gemma4)"
        )
    tokens: list[str] = fields.get("tokenizer.ggml.tokens") or []
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if model == "gpt2":
        spec = _byte_level_spec(fields, tokens, types, where)
    elif model == "gemma4":
        spec = _gemma4_spec(fields, tokens, types)
    else:
        spec = _sentencepiece_spec(fields, tokens, types)
    try:
        return HFTokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises plain Exceptions
        raise CheckpointError(f"{where}: cannot rebuild the tokenizer from GGUF metadata: {exc}") from exc


def _added(tokens: list[str], types: list[int], kinds: tuple[int, ...]) -> list[dict]:
    """Tokens matched whole before the model runs: special unless user-defined. Unused
    tokens (Gemma's ``<unusedN>``) are special too, as in the checkpoints' tokenizer.json:
    a model that emits one prints nothing, as llama-server prints nothing for it."""
    return [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": types[i] != USER_DEFINED}
        for i, t in enumerate(tokens)
        if types[i] in kinds
    ]  # fmt: skip


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


def _byte_level_spec(fields: dict[str, Any], tokens: list[str], types: list[int], where: str) -> dict:
    pre = fields.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_SPLITS:
        known = ", ".join(sorted(PRE_SPLITS))
        raise CheckpointError(f"{where}: GGUF pre-tokenizer '{pre}' is not supported (supported: {known})")
    merges: list[str] = fields.get("tokenizer.ggml.merges") or []
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    split = PRE_SPLITS[pre]
    if split is None:
        pre_tokenizer = {**byte_level, "use_regex": True}
    else:
        regex = {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False}
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [regex, {**byte_level, "use_regex": False}]}
    model = {
        "type": "BPE",
        "unk_token": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": split is LLAMA3,
        "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": [m.split(" ", 1) for m in merges],
    }
    added = _added(tokens, types, (CONTROL, USER_DEFINED, UNUSED))
    normalizer = {"type": "NFC"} if split is QWEN2 else None
    return _spec(added, pre_tokenizer, {**byte_level, "use_regex": True}, model, normalizer)


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
    # "first": one space in front of the text, none after each special token (transformers'
    # non-legacy Llama tokenizer; llama.cpp puts one after special tokens too)
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first" if prefix else "never",
                 "split": False}  # fmt: skip
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
    added = _added(tokens, types, (UNKNOWN, CONTROL, USER_DEFINED, UNUSED))
    return _spec(added, metaspace, {"type": "Sequence", "decoders": steps}, model)


def _gemma4_spec(fields: dict[str, Any], tokens: list[str], types: list[int]) -> dict:
    """Gemma 4's BPE (llama.cpp's ``gemma4``): spaces written as U+2581 by the
    normalizer, the text split only at newlines, the file's merges over raw UTF-8,
    characters outside the vocabulary as ``<0xNN>``; no space put in front."""
    merges: list[str] = fields.get("tokenizer.ggml.merges") or []
    split = {"type": "Split", "pattern": {"Regex": "[^\n]+|[\n]+"}, "behavior": "Isolated", "invert": False}
    steps = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    model = {
        "type": "BPE",
        "unk_token": None,
        "fuse_unk": False,
        "byte_fallback": True,
        "ignore_merges": False,
        "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": [m.split(" ", 1) for m in merges],
    }
    normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    added = _added(tokens, types, (UNKNOWN, CONTROL, USER_DEFINED, UNUSED))
    return _spec(added, split, {"type": "Sequence", "decoders": steps}, model, normalizer)


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
