"""A GGUF file's tokenizer rebuilt as a ``tokenizers`` tokenizer (the tokenizer.json a
Hugging Face folder would carry), from the metadata llama.cpp's converter writes:
``tokenizer.ggml.model`` (``gpt2``: byte-level BPE with merges), ``.pre`` (which
pre-tokenizer split the model was trained with), ``.tokens``, ``.token_type``,
``.merges``, the special token ids and ``tokenizer.chat_template``."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that are added (whole) tokens

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
    if model != "gpt2":
        kind = f"GGUF tokenizer model '{model}'"
        raise CheckpointError(f"{where}: {kind} is not supported yet (only gpt2, byte-level BPE)")
    pre = fields.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_SPLITS:
        known = ", ".join(sorted(PRE_SPLITS))
        raise CheckpointError(f"{where}: GGUF pre-tokenizer '{pre}' is not supported (supported: {known})")
    tokens: list[str] = fields.get("tokenizer.ggml.tokens") or []
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges: list[str] = fields.get("tokenizer.ggml.merges") or []
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": types[i] == CONTROL}
        for i, t in enumerate(tokens)
        if types[i] in (CONTROL, USER_DEFINED)
    ]  # fmt: skip
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    split = PRE_SPLITS[pre]
    if split is None:
        pre_tokenizer = {**byte_level, "use_regex": True}
    else:
        regex = {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False}
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [regex, {**byte_level, "use_regex": False}]}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if split is QWEN2 else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {**byte_level, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": split is LLAMA3,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in merges],
        },
    }
    try:
        return HFTokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises plain Exceptions
        raise CheckpointError(f"{where}: cannot rebuild the tokenizer from GGUF metadata: {exc}") from exc
