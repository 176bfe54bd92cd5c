"""A checkpoint's tokenizer: tokenizer.json through the ``tokenizers`` library, special
tokens and chat template from tokenizer_config.json (or chat_template.jinja), EOS ids
from generation_config.json and config.json."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.instance_cache import instance_cache
from engine.text.breakers import overlapping_sequences
from engine.text.chat_template import ChatTemplate
from engine.text.fim import find_fim_tokens
from engine.text.llama_formats import FormattedTemplate
from engine.text.tokenizer_classes import folder_tokenizer


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path}: file not found")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # transformers' serialized AddedToken
        return value.get("content")
    return value if isinstance(value, str) else None


def _template_source(folder: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    src = tok_cfg.get("chat_template")
    if isinstance(src, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in src if isinstance(t, dict)}
        src = named.get("default") or next(iter(named.values()), None)
    return src if isinstance(src, str) else None


def _byte_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character each byte is written as -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_UNICODE_TO_BYTE = _byte_table()
_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _UNICODE_TO_BYTE.items()})  # then .encode("latin-1")
_BYTE_PIECE = re.compile("[" + "".join(map(re.escape, _UNICODE_TO_BYTE)) + "]*")


class TokenizeError(ValueError):
    """Text that cannot be encoded (a client error)."""


class Tokenizer:
    def __init__(
        self,
        hf: HFTokenizer,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos: bool = False,
        eos_ids: set[int] | frozenset[int] = frozenset(),
        template: str | None = None,
        fim_fields: dict | None = None,
        add_eos: bool = False,
    ):
        """``eos_ids``: the ids that end generation (``eos_token``'s id is added);
        ``fim_fields``: GGUF metadata that may name the fill-in-the-middle tokens;
        ``add_bos`` / ``add_eos``: encoding with special tokens puts BOS first / EOS last
        where the tokenizer's own post-processor did not (llama.cpp's ``add_bos_token``,
        ``add_eos_token``: Qwen3-Embedding's files append EOS, which its last-token
        pooling reads)."""
        self.hf = hf
        self.bos_token, self.eos_token, self.add_bos, self.add_eos = bos_token, eos_token, add_bos, add_eos
        self.bos_id = self.hf.token_to_id(self.bos_token) if self.bos_token else None
        eos = set(eos_ids)
        if self.eos_token and self.hf.token_to_id(self.eos_token) is not None:
            eos.add(self.hf.token_to_id(self.eos_token))
        self.eos_ids = frozenset(int(x) for x in eos)
        self.chat_template = ChatTemplate(template, self._specials) if template else None
        self.fim = find_fim_tokens(self.hf.token_to_id, fim_fields)

    @classmethod
    def from_folder(cls, folder: Path, config_eos: tuple[int, ...] = ()) -> Tokenizer:
        """A Hugging Face folder's tokenizer.json through the pipeline of the class its
        tokenizer_config.json names, as transformers 5 builds it (tokenizer_classes.py),
        with tokenizer_config.json's special tokens and template and
        generation_config.json's EOS ids. Raises CheckpointError."""
        tok_cfg = _read_json(folder / "tokenizer_config.json", required=False)
        hf = folder_tokenizer(folder, tok_cfg)
        gen_cfg = _read_json(folder / "generation_config.json", required=False)
        eos = set(config_eos)
        gen_eos = gen_cfg.get("eos_token_id")
        eos.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))
        bos_token, eos_token = _token_text(tok_cfg.get("bos_token")), _token_text(tok_cfg.get("eos_token"))
        add_bos, add_eos = bool(tok_cfg.get("add_bos_token", False)), bool(tok_cfg.get("add_eos_token", False))
        return cls(hf, bos_token, eos_token, add_bos, eos, _template_source(folder, tok_cfg), add_eos=add_eos)

    @property
    def _specials(self) -> dict[str, str | None]:
        return {"bos_token": self.bos_token, "eos_token": self.eos_token}

    def use_chat_template(self, name: str, source: str | None) -> None:
        """Replace the model's template (raises ChatTemplateError when it does not parse);
        ``source`` None: llama-server's C++ format of that name."""
        self.chat_template = FormattedTemplate(name) if source is None else ChatTemplate(source, self._specials, name)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """An upper bound on the characters one token decodes to (the longest vocabulary
        entry: byte-level and SentencePiece entries are never shorter than their text),
        so a text longer than ``n * max_token_chars`` needs more than ``n`` tokens."""
        return max((len(t) for t in self.hf.get_vocab(with_added_tokens=True)), default=1)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Raises TokenizeError for text the tokenizer cannot take (lone surrogates).
        Releases the GIL while it works (``encode_batch`` does; ``encode`` does not), so
        a big text encoded in a worker thread does not stall the event loop."""
        try:
            ids = self.hf.encode_batch([text], add_special_tokens=add_special)[0].ids
        except (TypeError, ValueError) as exc:
            raise TokenizeError(f"the text cannot be tokenized: {exc}") from exc
        if add_special and self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        if add_special and self.add_eos and self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids = ids + [self.eos_id]
        return ids

    @functools.cached_property
    def eos_id(self) -> int | None:
        """``eos_token``'s id (what ``add_eos`` appends), or None."""
        return self.hf.token_to_id(self.eos_token) if self.eos_token else None

    @functools.cached_property
    def adds_bos(self) -> bool:
        """Whether encoding with special tokens puts BOS first (then a chat prompt carries
        no BOS text of its own: llama-server's rule against a double BOS)."""
        ids = self.encode("", True)
        return self.bos_id is not None and bool(ids) and ids[0] == self.bos_id

    @functools.cached_property
    def _byte_level(self) -> bool:
        decoder = json.loads(self.hf.to_str()).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(p.get("type") == "ByteLevel" for p in parts)

    @instance_cache(65536)
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a piece of a UTF-8 character stays a piece):
        byte-level BPE entries through GPT-2's byte table, SentencePiece ``<0xNN>``
        byte tokens as that byte and its other pieces with U+2581 as a space, added
        tokens as their decoded text."""
        return self._piece_bytes(token_id)

    @functools.cached_property
    def vocab_bytes(self) -> list[bytes]:
        """Every token's bytes (``token_bytes``), by id."""
        return [self._piece_bytes(i) for i in range(self.vocab_size)]

    @instance_cache(64)
    def breaker_sequences(self, breaker: str) -> tuple[tuple[int, ...], ...]:
        """DRY's sequences for one breaker string in this vocabulary (engine/text/breakers.py)."""
        return tuple(overlapping_sequences(self.vocab_bytes, lambda t: self.encode(t, False), breaker))

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self.hf.get_added_tokens_decoder())

    def _piece_bytes(self, token_id: int) -> bytes:
        piece = self.hf.id_to_token(token_id)
        if piece is None:
            return b""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        added = token_id in self._added_ids
        if self._byte_level and not added and _BYTE_PIECE.fullmatch(piece):
            return piece.translate(_TO_LATIN1).encode("latin-1")
        if not self._byte_level and not added:  # SentencePiece: U+2581 is a space (decode would strip a leading one)
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.hf.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of the added tokens marked special (what ``skip_special`` drops)."""
        return frozenset(i for i, t in self.hf.get_added_tokens_decoder().items() if t.special)

    def special_id(self, text: str) -> int | None:
        """The id of the special token written ``text``, or None when no special token is."""
        found = self.hf.token_to_id(text)
        return found if found is not None and found in self.special_ids else None

    def decode(self, ids: list[int], skip_special: bool = True, keep: frozenset[int] = frozenset()) -> str:
        """``keep``: special tokens decoded as their text even when ``skip_special``."""
        if skip_special and keep:
            ids, skip_special = [i for i in ids if i in keep or i not in self.special_ids], False
        if len(ids) > 64:  # the batch call releases the GIL
            return self.hf.decode_batch([ids], skip_special_tokens=skip_special)[0]
        return self.hf.decode(ids, skip_special_tokens=skip_special)
