"""A Hugging Face folder is tokenized with the pipeline transformers 5 builds for it: the
class its tokenizer_config.json names (with that class's own normalizer and split),
unless config.json's model type registers another; tokenizer.json as written for the
generic classes. Each case is a folder whose tokenizer.json split differs from its
class's, checked against transformers' AutoTokenizer on the same folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checkpoints import write_spm_tokenizer
from encoders import write_wordpiece
from family_tokenizers import write_family_tokenizer

from engine.text.tokenizer import Tokenizer
from engine.text.tokenizer_classes import chosen_class

CORPUS = json.loads((Path(__file__).parent / "data" / "pre_tokenizers.json").read_text(encoding="utf-8"))["corpus"]


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory) -> dict[str, Path]:
    """tokenizer.json files of three kinds: byte-level BPE with GPT-2's split and with
    Qwen's (and NFC), SentencePiece-style BPE (Llama 2's), WordPiece."""
    root = tmp_path_factory.mktemp("vocab")
    made = {}
    for name, pre in (("gpt2", "gpt-2"), ("qwen", "qwen2")):
        made[name] = root / name
        made[name].mkdir()
        write_family_tokenizer(made[name], pre, 600, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    made["spm"] = root / "spm"
    write_spm_tokenizer(made["spm"], 600)
    made["wordpiece"] = root / "wordpiece"
    made["wordpiece"].mkdir()
    write_wordpiece(made["wordpiece"])
    return made


def folder_as(vocab: Path, dst: Path, tokenizer_class: str | None, model_type: str | None = None, **cfg) -> Path:
    """``vocab``'s tokenizer.json with a tokenizer_config.json naming ``tokenizer_class``
    (and ``cfg``) and a config.json of ``model_type``."""
    shutil.copytree(vocab, dst)
    tok_cfg = (
        json.loads((dst / "tokenizer_config.json").read_text()) if (dst / "tokenizer_config.json").is_file() else {}
    )
    tok_cfg.pop("tokenizer_class", None)
    tok_cfg.update(cfg, **({"tokenizer_class": tokenizer_class} if tokenizer_class else {}))
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    if model_type:
        (dst / "config.json").write_text(json.dumps({"model_type": model_type}))
    return dst


# RoBERTa's class adds its own special tokens (<s>, </s>, <mask>, ...) where the folder names none
ROBERTA_SPECIALS = dict.fromkeys(("bos_token", "eos_token", "sep_token", "cls_token", "unk_token", "pad_token",
                                  "mask_token"), "<|endoftext|>")  # fmt: skip
CASES = [  # (tokenizer.json, class named, config.json's model type, extra tokenizer_config fields, class built)
    ("gpt2", "Qwen2Tokenizer", None, {}, "Qwen2Tokenizer"),
    ("gpt2", "Qwen2TokenizerFast", "qwen3", {}, "Qwen2Tokenizer"),
    ("gpt2", "Qwen2Tokenizer", "qwen3_5", {}, "Qwen3_5Tokenizer"),  # Qwen3.5's folders name the wrong class
    ("gpt2", None, "qwen3_5_moe_text", {}, "Qwen3_5Tokenizer"),
    ("qwen", "GPT2Tokenizer", None, {}, "GPT2Tokenizer"),
    ("qwen", "GPT2Tokenizer", None, {"add_prefix_space": True}, "GPT2Tokenizer"),
    ("qwen", "GPT2Tokenizer", "granitemoehybrid", {}, "TokenizersBackend"),  # a generic class registered
    ("qwen", "GPTNeoXTokenizerFast", None, {}, "GPTNeoXTokenizer"),
    ("qwen", "RobertaTokenizer", None, ROBERTA_SPECIALS, "RobertaTokenizer"),
    ("qwen", "CohereTokenizerFast", None, {}, "CohereTokenizer"),
    ("qwen", "PreTrainedTokenizerFast", "qwen3", {}, "PreTrainedTokenizerFast"),
    ("qwen", "PreTrainedTokenizerFast", "qwen2", {}, "Qwen2Tokenizer"),
    ("qwen", "LlamaTokenizerFast", "llama", {}, "TokenizersBackend"),  # Llama 3: byte-level, as written
    ("spm", "LlamaTokenizer", None, {"legacy": False}, "LlamaTokenizer"),
    ("spm", "LlamaTokenizer", "phi3", {}, "TokenizersBackend"),
    ("spm", "GemmaTokenizer", None, {}, "GemmaTokenizer"),
    ("spm", None, "gemma3_text", {}, "GemmaTokenizer"),
    ("wordpiece", "BertTokenizer", None, {"do_lower_case": False}, "BertTokenizer"),
]


@pytest.mark.parametrize("vocab, named, model_type, cfg, built", CASES)
def test_a_folder_tokenizes_as_transformers_builds_its_class(
    vocabularies, tmp_path, vocab, named, model_type, cfg, built
):
    from transformers import AutoTokenizer

    folder = folder_as(vocabularies[vocab], tmp_path / "folder", named, model_type, **cfg)
    spec = json.loads((folder / "tokenizer.json").read_text())
    byte_level = "ByteLevel" in json.dumps(spec["pre_tokenizer"])
    assert chosen_class(named, model_type, byte_level) == built
    hf = AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_folder(folder)
    want = [hf.encode(text, add_special_tokens=False) for text in CORPUS]
    assert [ours.encode(text, add_special=False) for text in CORPUS] == want


def test_the_class_changes_the_tokens(vocabularies, tmp_path):
    """The cases above are not alike by chance: the same tokenizer.json under the generic
    class and under Qwen2Tokenizer gives other tokens (Qwen's digit split, NFC)."""
    plain = Tokenizer.from_folder(folder_as(vocabularies["gpt2"], tmp_path / "a", "PreTrainedTokenizerFast"))
    qwen = Tokenizer.from_folder(folder_as(vocabularies["gpt2"], tmp_path / "b", "Qwen2Tokenizer"))
    assert sum(plain.encode(t, add_special=False) != qwen.encode(t, add_special=False) for t in CORPUS) >= 3
