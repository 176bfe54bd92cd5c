"""Which tokenizer pipeline a Hugging Face folder's text goes through, as transformers 5
chooses it (``AutoTokenizer``, transformers 5.25), so that a folder is tokenized as
transformers, vLLM and llama.cpp's converter tokenize it.

transformers 5 builds the class named in tokenizer_config.json (``Qwen2Tokenizer``,
``GPT2Tokenizer``, ...) with that class's own normalizer, split and decoder, taking only
the vocabulary, merges and post-processor from tokenizer.json; the generic classes
(``PreTrainedTokenizerFast``, ``TokenizersBackend``) take tokenizer.json as written. The
class is the one named, except where config.json's model type registers another:

- a model type whose files are known to name a wrong class (transformers'
  ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``: Qwen3.5's folders name
  ``Qwen2Tokenizer``) gets its registered class;
- a model type that registers a generic class gets tokenizer.json as written whatever
  the folder names (Granite 4.0's ``GPT2Tokenizer``, Phi-3's ``LlamaTokenizer``);
- ``LlamaTokenizer`` over a byte-level tokenizer.json (Llama 3 style) is tokenizer.json
  as written;
- no class named: the model type's registered class.

The tables below are transformers 5.25's, for the model types slotserve serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.text.splits import QWEN2, QWEN35

GENERIC = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast", "PythonBackend", "MistralCommonBackend"})

# transformers' TOKENIZER_MAPPING_NAMES for the model types served (absent: none registered)
REGISTERED = {
    **dict.fromkeys(("qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "qwen3_next", "qwen2_5_vl", "qwen2_vl"),
                    "Qwen2Tokenizer"),
    **dict.fromkeys(("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), "Qwen3_5Tokenizer"),
    **dict.fromkeys(("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text"), "GemmaTokenizer"),
    "mamba2": "GPTNeoXTokenizer",
    **dict.fromkeys(("bert", "nomic_bert"), "BertTokenizer"),
    "xlm-roberta": "XLMRobertaTokenizer",
    **dict.fromkeys(("glm4_moe", "phi3", "mistral", "granitemoehybrid", "jamba", "smolvlm", "modernbert"),
                    "TokenizersBackend"),
}  # fmt: skip
# transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, for the model types served
WRONG_HUB_CLASS = frozenset(
    {"qwen2", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "phi3", "jamba", "smolvlm", "modernbert"}
)

_BYTE_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
_SPACE_BYTES = [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
]  # SentencePiece-style decoding: U+2581 as a space, <0xNN> as bytes
_BPE_PLAIN = {"byte_fallback": False, "ignore_merges": False, "fuse_unk": False}


def chosen_class(named: str | None, model_type: str | None, byte_level_json: bool) -> str:
    """The class transformers 5 builds for a folder: ``named`` in tokenizer_config.json,
    config.json's ``model_type``, whether tokenizer.json's split is byte-level."""
    named = named.removesuffix("Fast") if named and named != "PreTrainedTokenizerFast" else named
    registered = REGISTERED.get(model_type or "")
    if named == "LlamaTokenizer" and byte_level_json and model_type not in WRONG_HUB_CLASS:
        return "TokenizersBackend"
    if named and registered and registered != named:
        if registered in GENERIC:
            return "TokenizersBackend"
        return registered if model_type in WRONG_HUB_CLASS else named
    return named or registered or "TokenizersBackend"


def class_pipeline(name: str, tok_cfg: dict[str, Any]) -> dict[str, Any] | None:
    """{"normalizer", "pre_tokenizer", "decoder", "model"} (tokenizer.json objects; "model":
    the fields the class sets on its model) that class ``name`` builds from the folder's
    tokenizer_config.json ``tok_cfg``; None where tokenizer.json is taken as written
    (the generic classes, and classes whose pipeline is the file's: XLM-RoBERTa's
    SentencePiece Unigram, with its own charsmap)."""
    prefix = bool(tok_cfg.get("add_prefix_space") or False)
    byte_level = {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True}
    if name in ("Qwen2Tokenizer", "Qwen3_5Tokenizer"):
        split = {"type": "Split", "pattern": {"Regex": QWEN2 if name == "Qwen2Tokenizer" else QWEN35},
                 "behavior": "Isolated", "invert": False}  # fmt: skip
        pre = {"type": "Sequence", "pretokenizers": [split, {**byte_level, "use_regex": False}]}
        return {"normalizer": {"type": "NFC"}, "pre_tokenizer": pre, "decoder": _BYTE_DECODER, "model": _BPE_PLAIN}
    if name in ("GPT2Tokenizer", "RobertaTokenizer", "GPTNeoXTokenizer"):
        normalizer = {"type": "NFC"} if name == "GPTNeoXTokenizer" else None
        pre = {**byte_level, "use_regex": True}
        return {"normalizer": normalizer, "pre_tokenizer": pre, "decoder": _BYTE_DECODER, "model": _BPE_PLAIN}
    if name == "CohereTokenizer":
        pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                     {**byte_level, "use_regex": True}]}  # fmt: skip
        return {"normalizer": {"type": "NFC"}, "pre_tokenizer": pre, "decoder": _BYTE_DECODER, "model": _BPE_PLAIN}
    if name in ("LlamaTokenizer", "CodeLlamaTokenizer"):
        prefix = tok_cfg.get("add_prefix_space") is not False  # the class's default: True
        scheme = ("always" if tok_cfg.get("legacy") else "first") if prefix else "never"
        steps = [*_SPACE_BYTES, *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])]
        pre = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": False}
        return {"normalizer": None, "pre_tokenizer": pre, "decoder": {"type": "Sequence", "decoders": steps},
                "model": {"byte_fallback": True, "fuse_unk": True, "ignore_merges": False}}  # fmt: skip
    if name == "GemmaTokenizer":
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        decoder = {"type": "Sequence", "decoders": _SPACE_BYTES}
        return {"normalizer": normalizer, "pre_tokenizer": pre, "decoder": decoder,
                "model": {"byte_fallback": True, "fuse_unk": True, "ignore_merges": False}}  # fmt: skip
    if name == "BertTokenizer":
        normalizer = {"type": "BertNormalizer", "clean_text": True,
                      "handle_chinese_chars": tok_cfg.get("tokenize_chinese_chars", True) is not False,
                      "strip_accents": tok_cfg.get("strip_accents"),
                      "lowercase": tok_cfg.get("do_lower_case", True) is not False}  # fmt: skip
        return {"normalizer": normalizer, "pre_tokenizer": {"type": "BertPreTokenizer"},
                "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}, "model": {}}  # fmt: skip
    return None


def is_byte_level(pre_tokenizer: dict | None) -> bool:
    """Whether a tokenizer.json's split ends in GPT-2's byte-level step."""
    if not pre_tokenizer:
        return False
    steps = (
        pre_tokenizer.get("pretokenizers", [pre_tokenizer])
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    return any(s.get("type") == "ByteLevel" for s in steps)


def folder_tokenizer(folder: Path, tok_cfg: dict[str, Any]) -> HFTokenizer:
    """A folder's tokenizer.json through the pipeline transformers 5 builds for it (the
    chosen class's, or the file's as written). Raises CheckpointError."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        model_type = None
        if (folder / "config.json").is_file():
            model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
        name = chosen_class(tok_cfg.get("tokenizer_class"), model_type, is_byte_level(spec.get("pre_tokenizer")))
        built = class_pipeline(name, tok_cfg)
        if built is not None and (spec.get("model") or {}).get("type") in ("BPE", "WordPiece"):
            spec.update(normalizer=built["normalizer"], pre_tokenizer=built["pre_tokenizer"], decoder=built["decoder"])
            spec["model"].update(built["model"])
        return HFTokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise CheckpointError(f"{path}: cannot parse tokenizer: {exc}") from exc
