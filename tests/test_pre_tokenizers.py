"""Every pre-tokenizer name the pinned llama.cpp knows (engine/text/splits.py), against
llama.cpp's own tokens and transformers'.

tests/data/pre_tokenizers.json was recorded once by bench/pre_tokenizer_golden.py: for
each name, a small vocabulary trained with that name's split, written as a GGUF file
under that name, and a corpus that stresses splits (code, digit runs, CJK, Thai,
Devanagari, emoji and ZWJ sequences, combining marks, contractions in capitals,
whitespace runs, CR LF, text that looks like special tokens) tokenized by the pinned
llama.cpp's ``llama-tokenize``. Here the same files are written again and read by
slotserve's GGUF loader; the same vocabularies as Hugging Face folders are read by
transformers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from gguf_tools import LLAMA_VOCAB, converter_tree, write_vocab_gguf
from unavailable import unavailable

from engine.errors import CheckpointError
from engine.loading.gguf.header import read_header
from engine.loading.gguf.tokenizer import REFUSED, build_tokenizer
from engine.text.splits import SPLITS
from engine.text.tokenizer import Tokenizer

DATA = json.loads((Path(__file__).parent / "data" / "pre_tokenizers.json").read_text(encoding="utf-8"))
CORPUS: list[str] = DATA["corpus"]

# Where llama.cpp's tokens differ from the family's own tokenizer, slotserve gives the
# family's (a GGUF file answers as the folder it was converted from): name -> (the texts
# of CORPUS that differ, why).
_MARKS = "llama.cpp rewrites the case classes with lookaheads over \\p{L} and loses \\p{M}: combining marks split off"
_NFC = "the folder's tokenizer normalizes to NFC (Qwen2Tokenizer, Qwen3_5Tokenizer); llama.cpp does not"
_DIGITS = "llama.cpp groups a digit run by threes from its end; the family's \\d{1,3}(?=(?:\\d{3})*\\b) finds no \\b before a CJK letter"  # noqa: E501
_CASE = "llama.cpp's regex engine reads \\p{Lu} and \\p{Ll} as any letter: HTTPServerError is not cut at ServerError"
FOLLOWS_THE_FOLDER = {
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "f2llmv2", "qwen35"), ({6}, _NFC)),
    **dict.fromkeys(("tekken", "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2", "kimi-k2"), ({3, 4, 6}, _MARKS)),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), ({2}, _DIGITS)),
    "youtu": ({11}, _CASE),
}
# Names the converter writes beside a vocabulary that is not byte-pair merges, where
# llama.cpp reads no pre-tokenizer name (WordPiece, SentencePiece).
NOT_BPE = {"bert-bge", "bert-bge-large", "jina-v2-en", "chatglm-spm"}


@pytest.fixture(scope="module")
def tree() -> Path:
    try:
        return converter_tree()
    except RuntimeError as exc:
        unavailable(f"llama.cpp's sources cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Every name's vocabulary-only GGUF, as the golden script wrote it."""
    folder = tmp_path_factory.mktemp("pre")
    return {
        name: write_vocab_gguf(folder / f"{name}.gguf", name, DATA["vocabs"][rec["vocab"]])
        for name, rec in DATA["names"].items()
    }


def ours(path: Path) -> Tokenizer:
    return Tokenizer(build_tokenizer(read_header(path).fields, str(path)))


def test_the_table_has_one_entry_for_every_name_llama_cpp_knows(tree):
    source = (tree / LLAMA_VOCAB).read_text(encoding="utf-8")
    known = set(re.findall(r'tokenizer_pre == "([^"]+)"', source))
    assert len(known) > 80
    assert set(SPLITS) == known
    assert set(DATA["names"]) == known  # and each has golden tokens


def test_no_name_the_converter_writes_is_refused(tree):
    written = set()
    for script in (tree / "conversion").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        written |= set(re.findall(r'res = "([^"]+)"', text)) | set(re.findall(r'add_tokenizer_pre\("([^"]+)"\)', text))
    assert len(written) > 80
    assert written - set(SPLITS) == NOT_BPE


@pytest.mark.parametrize("name", sorted(DATA["names"]))
def test_tokens_are_llama_cpps_for_every_name(files, name):
    tok = ours(files[name])
    golden = DATA["names"][name]["ids"]
    differ = {i for i, text in enumerate(CORPUS) if tok.encode(text, add_special=False) != golden[i]}
    assert differ == FOLLOWS_THE_FOLDER.get(name, (set(), ""))[0]


@pytest.mark.parametrize("key", sorted(DATA["vocabs"]))
def test_tokens_are_transformers_on_the_same_vocabulary_as_a_folder(files, tmp_path, key):
    """The folder's tokenizer.json carries the family's split as its own files write it;
    transformers reads it as any folder (PreTrainedTokenizerFast). Every name that shares
    the vocabulary answers the same."""
    from transformers import AutoTokenizer

    names = [n for n, rec in DATA["names"].items() if rec["vocab"] == key]
    spec = json.loads(ours(files[key]).hf.to_str())
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    hf = AutoTokenizer.from_pretrained(tmp_path)
    want = [hf.encode(text, add_special_tokens=False) for text in CORPUS]
    for name in names:
        assert [ours(files[name]).encode(text, add_special=False) for text in CORPUS] == want, name


def test_the_folder_split_differs_from_llama_cpp_where_listed_and_why(files):
    """Each exception is real (the texts differ from llama.cpp's tokens) and says why."""
    for name, (texts, why) in FOLLOWS_THE_FOLDER.items():
        tok, golden = ours(files[name]), DATA["names"][name]["ids"]
        assert why and all(tok.encode(CORPUS[i], add_special=False) != golden[i] for i in texts), name


def test_a_file_without_a_pre_name_splits_as_llama_cpps_default(files):
    fields = read_header(files["default"]).fields
    del fields["tokenizer.ggml.pre"]
    tok = Tokenizer(build_tokenizer(fields, "bare.gguf"))
    assert [tok.encode(t, add_special=False) for t in CORPUS] == DATA["names"]["default"]["ids"]


@pytest.mark.parametrize("model", sorted(REFUSED))
def test_a_vocabulary_kind_not_served_is_refused_by_name(files, model):
    fields = dict(read_header(files["gpt-2"]).fields, **{"tokenizer.ggml.model": model})
    with pytest.raises(CheckpointError, match=f"'{model}' is not supported: {re.escape(REFUSED[model])}"):
        build_tokenizer(fields, "file.gguf")


def test_a_pre_name_llama_cpp_does_not_know_is_refused_by_name(files):
    fields = dict(read_header(files["gpt-2"]).fields, **{"tokenizer.ggml.pre": "gpt-5-turbo"})
    with pytest.raises(CheckpointError, match="pre-tokenizer 'gpt-5-turbo' is not one the pinned llama.cpp knows"):
        build_tokenizer(fields, "file.gguf")
