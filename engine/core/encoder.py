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
``Normalize`` module), unless the caller names them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import CheckpointError
from engine.loading.checkpoint import iter_tensors, weight_files
from engine.loading.gguf.encoder_file import EncoderFile
from engine.loading.pooling_hint import checkpoint_pooling
from engine.models.bert import ARCHITECTURES, MODEL_TYPES, BertEncoder

POOLINGS = ("none", "mean", "cls", "last")


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str
    hidden_size: int
    max_tokens: int  # an input's tokens after truncation, special tokens included
    pooling: str  # one of POOLINGS
    normalize: bool


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
    arch = (raw.get("architectures") or [None])[0]
    if arch in ARCHITECTURES:
        return arch
    return MODEL_TYPES.get(raw.get("model_type", "")) if arch is None else None


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


def _st_modules(folder: Path) -> list[dict]:
    try:
        return json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return []


def _loaded(raw: dict, kind: str, tensors) -> BertEncoder:
    """The encoder ``raw`` describes, built on the meta device, then filled from
    (file, name, tensor) triples; float32, for inference."""
    with torch.device("meta"):
        model = BertEncoder(raw, kind)
    model = model.to_empty(device="cpu").float()
    with torch.no_grad():
        model.load_weights(tensors)
    return model.eval().requires_grad_(False)


class EncoderEngine:
    def __init__(self, model: BertEncoder, tokenizer: HFTokenizer, config: EncoderConfig, batch_tokens: int = 8192):
        self.model, self.tokenizer, self.config, self.batch_tokens = model, tokenizer, config, batch_tokens

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
            served = ", ".join(ARCHITECTURES)
            raise CheckpointError(f"{folder / 'config.json'}: not an encoder slotserve serves ({served})")
        model = _loaded(raw, ARCHITECTURES[arch], iter_tensors(weight_files(folder)))
        tokenizer = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        limit = min(model.max_positions, _max_seq_length(folder) or model.max_positions)
        tokenizer.enable_truncation(limit)
        tokenizer.no_padding()
        modules = _st_modules(folder)
        config = EncoderConfig(
            architecture=arch,
            hidden_size=int(raw["hidden_size"]),
            max_tokens=limit,
            pooling=pooling or checkpoint_pooling(str(folder)) or "cls",
            normalize=any(str(m.get("type", "")).endswith("Normalize") for m in modules)
            if normalize is None
            else normalize,
        )
        return cls(model, tokenizer, config, batch_tokens)

    @classmethod
    def _from_gguf(cls, path: Path, pooling: str | None, normalize: bool | None, batch_tokens: int) -> EncoderEngine:
        """A GGUF ``bert`` file (engine/loading/gguf/encoder_file.py): pooling from its
        ``bert.pooling_type``; not normalized unless asked (the file does not say: the
        server's routes normalize, as llama-server's)."""
        file = EncoderFile(path)
        raw = file.config()
        model = _loaded(raw, "bert", file.iter_tensors())
        tokenizer = file.tokenizer()
        tokenizer.enable_truncation(model.max_positions)
        tokenizer.no_padding()
        config = EncoderConfig(
            architecture="BertModel",
            hidden_size=int(raw["hidden_size"]),
            max_tokens=model.max_positions,
            pooling=pooling or checkpoint_pooling(str(path), file.fields) or "cls",
            normalize=bool(normalize),
        )
        return cls(model, tokenizer, config, batch_tokens)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens in, cut at ``max_tokens``."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    @torch.inference_mode()
    def embed(self, inputs: list[list[int]], pooling: str | None = None) -> list[torch.Tensor]:
        """Token-id inputs -> one vector [hidden] per input (pooling ``none``: [T, hidden]),
        normalized where the config says; float32. Inputs run sorted by length, in padded
        batches of at most ``batch_tokens`` tokens."""
        pooling = pooling or self.config.pooling
        if pooling not in POOLINGS:
            raise ValueError(f"pooling '{pooling}': one of {', '.join(POOLINGS)}")
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
            for row, i in enumerate(batch):
                ids[row, : len(inputs[i])] = torch.tensor(inputs[i], dtype=torch.long)
            lengths = torch.tensor([len(inputs[i]) for i in batch])
            hidden = self.model(ids, lengths)  # [B, T, hidden]
            for row, i in enumerate(batch):
                out[i] = self._pool(hidden[row, : int(lengths[row])], pooling)
            start = end
        return out  # type: ignore[return-value]

    def _pool(self, h: torch.Tensor, pooling: str) -> torch.Tensor:
        """h [T, hidden] -> [hidden] (none: [T, hidden]), normalized where configured."""
        vec = {"none": h, "mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]
        return torch.nn.functional.normalize(vec, dim=-1) if self.config.normalize else vec.clone()
