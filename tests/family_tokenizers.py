"""Tokenizers shaped as a family's real ones, for tiny test checkpoints: a byte-pair
vocabulary trained with the family's own split (engine/text/splits.py, by the name
llama.cpp's converter writes for it), its special tokens, and the tokenizer class its
tokenizer_config.json names. The converter cannot recognize a vocabulary this small by
its hash, so ``gguf_tools.convert`` is told the family's name (``pre=``)."""

from __future__ import annotations

import json
from pathlib import Path

TRAINING = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import os\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n",
    "The quick brown fox jumps over the lazy dog. It's 1234567 o'clock; they'll see.",
    "Slots keep sessions warm; a prefix copy is metadata only. 你好，世界！ Привет, мир! Café naïve",
    "user: hello there\nassistant: hi! how can I help you today?\n",
]


def untrained(split) -> Tokenizer:  # noqa: F821 (tokenizers' class, imported where used)
    """An empty byte-pair tokenizer with ``split`` (engine/text/splits.py), for a trainer."""
    from tokenizers import Tokenizer

    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": split.normalizer(),
        "pre_tokenizer": split.pre_tokenizer(), "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "vocab": {}, "merges": [], "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": split.ignore_merges},
    }  # fmt: skip
    return Tokenizer.from_str(json.dumps(spec))


def write_family_tokenizer(
    folder: Path,
    pre: str,
    vocab_size: int,
    specials: tuple[str, ...] = ("<|endoftext|>",),
    tokenizer_class: str = "PreTrainedTokenizerFast",
    config: dict | None = None,
) -> None:
    """tokenizer.json (byte-level BPE, ``vocab_size`` entries with the specials, trained
    with the split llama.cpp calls ``pre``) and tokenizer_config.json naming
    ``tokenizer_class`` (``config``: more of its fields: eos_token, chat_template...)."""
    from tokenizers import pre_tokenizers, trainers

    from engine.text.splits import SPLITS

    tok = untrained(SPLITS[pre])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING * 4, trainer)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": tokenizer_class, **(config or {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
