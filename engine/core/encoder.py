"""Embeddings from encoder models (issue 54): BERT and XLM-RoBERTa folders, GGUF
``bert`` files (engine/models/bert.py, engine/loading/gguf/encoder_file.py). Encoders
keep no cache and need no slot: many short inputs are sorted by length and run as
padded one-shot batches of at most ``batch_tokens`` padded tokens, beside the
generation engine rather than through it.

The folder's own tokenizer (``tokenizer.json``: WordPiece or SentencePiece/Unigram,
through ``tokenizers``, its post-processor adding [CLS] / [SEP] or <s> / </s>) cuts an
input at sentence-transformers' limit (``_max_seq_length``) or the position table's
length. Pooling and normalization are what the folder's
sentence-transformers modules say (``modules.json``: a ``*_Pooling`` config, a
``Normalize`` module), unless the caller names them.

A cross-encoder (``*ForSequenceClassification``, or a GGUF file with a ``cls.output``
head) also pools ``rank``: its head's logits over the first token of a (query,
document) pair, encoded as its tokenizer pairs them (the document's tokens of type 1)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.kernels.block_model import pack_block_linears
from engine.loading.checkpoint import iter_tensors, weight_files
from engine.loading.dense_modules import folder_dense, out_features, weights_dense
from engine.loading.gguf.encoder_file import EncoderFile
from engine.loading.materialize import materialize
from engine.loading.pooling_hint import checkpoint_pooling, matryoshka_sizes
from engine.models.bert import n_labels
from engine.models.encoder_base import EncoderModel
from engine.models.encoder_registry import SERVED, find
from engine.text.tokenizer_classes import folder_tokenizer

POOLINGS = ("none", "mean", "cls", "last", "rank")


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str
    hidden_size: int
    max_tokens: int  # an input's tokens after truncation, special tokens included
    pooling: str  # one of POOLINGS
    normalize: bool
    n_labels: int = 0  # a classifier's outputs (what ``rank`` pools to); 0: no head
    matryoshka: Sequence[int] | None = None  # the leading lengths an embedding may be cut to (None: whole only)


def is_encoder(folder: Path) -> bool:
    """Whether ``folder``'s config (or a GGUF file's architecture) names an encoder
    this module serves."""
    if Path(folder).is_file():
        try:
            EncoderFile(Path(folder))
        except CheckpointError:
            return False
        return True
    try:
        raw = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return _architecture(raw) is not None


def _architecture(raw: dict) -> str | None:
    """The encoder architecture a config names (engine/models/encoder_registry.py), or None."""
    found = find(raw)
    if found is None:
        return None
    enc, classifier = found
    return enc.classifier if classifier else enc.architecture


def _width(raw: dict) -> int:
    """The model's output size: EmbeddingGemma 2's ``embedding_dim`` (its text config's),
    else the hidden size."""
    text = raw.get("text_config") or raw
    return int(text.get("embedding_dim") or text.get("n_embd") or text["hidden_size"])


def _max_seq_length(folder: Path) -> int | None:
    """sentence-transformers' input limit: ``sentence_bert_config.json``'s
    ``max_seq_length`` (as published models carry it), else the tokenizer config's
    ``model_max_length`` (where sentence-transformers 6 writes it; its 1e30 "none" aside)."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = int(json.loads((folder / name).read_text())[key])
        except (OSError, ValueError, KeyError, TypeError, OverflowError):
            continue
        if 0 < value < 1 << 20:
            return value
    return None


def _tokenizer_config(folder: Path) -> dict:
    """``tokenizer_config.json`` ({} where there is none or it does not parse as an object)."""
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _special_names(folder: Path) -> tuple[str | None, str | None]:
    """(first, last) special token of ``tokenizer_config.json``: ``bos_token`` else
    ``cls_token``, ``eos_token`` else ``sep_token`` (None where it names none)."""
    cfg = _tokenizer_config(folder)

    def name(*keys: str) -> str | None:
        for key in keys:
            value = cfg.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                return value
        return None

    return name("bos_token", "cls_token"), name("eos_token", "sep_token")


def _st_modules(folder: Path) -> list[dict]:
    try:
        return json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return []


def _loaded(raw: dict, tensors, head_dense: bool = True, blocks: frozenset[str] = frozenset()) -> EncoderModel:
    """The encoder ``raw`` describes, built on the meta device, then filled from
    (file, name, tensor) triples; float32, for inference. A classifier (a cross-encoder) gets its
    head (``head_dense``: with the dense layer before the projection). ``blocks``: the
    weights that come in GGUF blocks; their layers compute on them (repacked for the
    integer kernel where the type has a packed layout)."""
    enc, classifier = find(raw)
    head = (n_labels(raw), head_dense) if classifier else None
    with torch.device("meta"):
        model = enc.build(raw, head)
    model.to_blocks(blocks)
    model = materialize(model, "cpu").float()
    with torch.no_grad():
        model.load_weights(tensors)
    if blocks:
        pack_block_linears(model)
    return model.eval().requires_grad_(False)


class EncoderEngine:
    def __init__(
        self,
        model: EncoderModel,
        tokenizer: HFTokenizer,
        config: EncoderConfig,
        batch_tokens: int = 8192,
        dense: torch.nn.Module | None = None,
    ):
        """``tokenizer``: the model's, as it cuts nothing (``full_tokenizer``); ``tokenizer``
        is a copy that cuts at ``config.max_tokens``. ``dense``: what maps a pooled vector
        [hidden] to the embedding [config.hidden_size] (sentence-transformers' Dense
        modules), or None."""
        self.model, self.config, self.batch_tokens, self.dense = model, config, batch_tokens, dense
        self.special_names: tuple[str | None, str | None] = (None, None)  # (BOS or [CLS], EOS or [SEP])
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.full_tokenizer = tokenizer
        self.tokenizer = HFTokenizer.from_str(tokenizer.to_str())
        self.tokenizer.enable_truncation(config.max_tokens)

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, pooling: str | None = None, normalize: bool | None = None, batch_tokens: int = 8192
    ) -> EncoderEngine:
        """``folder``: a Hugging Face folder, or a GGUF ``bert`` file. Raises
        CheckpointError for one that is not a supported encoder."""
        folder = Path(folder)
        if folder.is_file():
            return cls._from_gguf(folder, pooling, normalize, batch_tokens)
        try:
            raw = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{folder / 'config.json'}: {exc}") from exc
        arch = _architecture(raw)
        if arch is None:
            served = ", ".join(SERVED)
            raise CheckpointError(f"{folder / 'config.json'}: not an encoder slotserve serves ({served})")
        model = _loaded(raw, iter_tensors(weight_files(folder)))
        tokenizer = folder_tokenizer(folder, _tokenizer_config(folder))
        limit = min(model.max_positions, _max_seq_length(folder) or model.max_positions)
        modules = _st_modules(folder)
        dense = folder_dense(folder, modules)
        size = out_features(dense) if dense else _width(raw)
        config = EncoderConfig(
            architecture=arch,
            hidden_size=size,
            max_tokens=limit,
            pooling=pooling or ("rank" if model.head else checkpoint_pooling(str(folder)) or model.default_pooling),
            normalize=any(str(m.get("type", "")).endswith("Normalize") for m in modules)
            if normalize is None
            else normalize,
            n_labels=model.n_labels,
            matryoshka=matryoshka_sizes(raw, size),
        )
        engine = cls(model, tokenizer, config, batch_tokens, dense)
        engine.special_names = _special_names(folder)
        return engine

    @classmethod
    def _from_gguf(cls, path: Path, pooling: str | None, normalize: bool | None, batch_tokens: int) -> EncoderEngine:
        """A GGUF ``bert`` file (engine/loading/gguf/encoder_file.py): pooling from its
        ``bert.pooling_type``; not normalized unless asked (the file does not say: the
        server's routes normalize, as llama-server's)."""
        file = EncoderFile(path)
        raw = file.config()
        blocks = file.block_names()
        model = _loaded(raw, file.iter_tensors(True), "cls.weight" in file.tensors, blocks)
        tokenizer = file.tokenizer()
        dense = weights_dense(file.dense())
        named = checkpoint_pooling(str(path), file.fields)
        config = EncoderConfig(
            architecture=raw["architectures"][0],
            hidden_size=out_features(dense) if dense else _width(raw),
            max_tokens=model.max_positions,
            pooling=pooling or ("rank" if model.head else named or model.default_pooling),
            normalize=bool(normalize),
            n_labels=model.n_labels,
        )
        engine = cls(model, tokenizer, config, batch_tokens, dense)
        engine.special_names = file.special_names()
        return engine

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens in, cut at ``max_tokens`` (``cut``)."""
        return [self.cut(e.ids) for e in self.full_tokenizer.encode_batch(texts, add_special_tokens=True)]

    @functools.cached_property
    def _around(self) -> tuple[list[int], list[int]]:
        """The special tokens the tokenizer puts before and after a text ([CLS] / [SEP],
        <s> / </s>, <bos> / <eos>; none where it adds none)."""
        marked = self.full_tokenizer.encode("a", add_special_tokens=True)
        mask, ids = marked.special_tokens_mask, marked.ids
        lead = next((i for i, m in enumerate(mask) if not m), len(ids))
        trail = next((i for i, m in enumerate(reversed(mask)) if not m), 0)
        return ids[:lead], ids[len(ids) - trail :]

    def cut(self, ids: list[int]) -> list[int]:
        """An input cut to ``max_tokens``: the one rule for every encoder input (a text
        and ids alike), sentence-transformers' and TEI's: the end of its content goes, the
        special tokens the tokenizer puts around a text stay where the input has them
        (ids without them are cut at the end). A (query, document) pair is cut by the
        tokenizer, the longer side first (``encode_pairs``), as sentence-transformers'
        CrossEncoder cuts it."""
        n = self.config.max_tokens
        if len(ids) <= n:
            return ids
        _, after = self._around
        keep = after if after and ids[-len(after) :] == after else []
        return ids[: n - len(keep)] + keep

    def encode_pairs(self, query: str, documents: list[str], cut: bool = True) -> list[tuple[list[int], list[int]]]:
        """(token ids, token types) of each (query, document) pair as the tokenizer pairs
        them; ``cut``: at ``max_tokens``, the longer side first."""
        tokenizer = self.tokenizer if cut else self.full_tokenizer
        pairs = tokenizer.encode_batch([(query, d) for d in documents], add_special_tokens=True)
        return [(e.ids, e.type_ids) for e in pairs]

    @torch.inference_mode()
    def embed(
        self, inputs: list[list[int]], pooling: str | list[str] | None = None, type_ids: list[list[int]] | None = None
    ) -> list[torch.Tensor]:
        """Token-id inputs -> one vector [hidden] per input (pooling ``none``: [T, hidden];
        ``rank``: the head's logits [n_labels]), normalized where the config says (rank
        never); float32. ``pooling``: one for all, or one per input; ``type_ids``: each
        input's token types (None: all 0). Inputs run sorted by length, in padded batches
        of at most ``batch_tokens`` tokens."""
        poolings = [pooling or self.config.pooling] * len(inputs) if not isinstance(pooling, list) else pooling
        served = POOLINGS if self.model.head is not None else POOLINGS[:-1]
        for p in set(poolings):
            if p not in served:
                raise ValueError(f"pooling '{p}': one of {', '.join(served)}")
        if any(not ids or len(ids) > self.config.max_tokens for ids in inputs):
            raise ValueError(f"an input has no tokens or more than {self.config.max_tokens}")
        out: list[torch.Tensor | None] = [None] * len(inputs)
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(inputs[order[end]]) <= self.batch_tokens:
                end += 1
            batch = order[start:end]
            width = max(1, len(inputs[batch[-1]]))
            ids = torch.full((len(batch), width), self.model.pad_id, dtype=torch.long)
            types = torch.zeros((len(batch), width), dtype=torch.long) if type_ids is not None else None
            for row, i in enumerate(batch):
                ids[row, : len(inputs[i])] = torch.tensor(inputs[i], dtype=torch.long)
                if types is not None:
                    types[row, : len(type_ids[i])] = torch.tensor(type_ids[i], dtype=torch.long)
            lengths = torch.tensor([len(inputs[i]) for i in batch])
            hidden = self.model(ids, lengths, types)  # [B, T, hidden]
            ranked = [row for row, i in enumerate(batch) if poolings[i] == "rank"]
            if ranked:
                logits = self.model.classify(hidden[ranked], lengths[ranked])  # [R, n_labels]
                for k, row in enumerate(ranked):
                    out[batch[row]] = logits[k].clone()
            for row, i in enumerate(batch):
                if poolings[i] != "rank":
                    out[i] = self._pool(hidden[row, : int(lengths[row])], poolings[i])
            start = end
        return out  # type: ignore[return-value]

    def _pool(self, h: torch.Tensor, pooling: str) -> torch.Tensor:
        """h [T, hidden] -> [hidden] (none: [T, hidden]), through the Dense modules
        (pooled vectors only, as sentence-transformers), normalized where configured."""
        vec = {"none": h, "mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]
        if self.dense is not None and pooling != "none":
            vec = self.dense(vec)  # [embedding]
        return torch.nn.functional.normalize(vec, dim=-1) if self.config.normalize else vec.clone()
