"""A GGUF encoder file (``bert``, ``nomic-bert``, ``modern-bert``, ``gemma-embedding``)
as engine/core/encoder.py reads an encoder folder (issue 54): the config, the tensors
under their Hugging Face names (dequantized to float32, or kept in blocks), and a
tokenizer rebuilt from the file's vocabulary: BERT's WordPiece, XLM-RoBERTa's
SentencePiece Unigram (``t5``: pieces, scores and the precompiled charsmap), or the
decoders' byte-level BPE (``gpt2``) and SentencePiece BPE (``llama``: Gemma's).
EmbeddingGemma's Dense modules after pooling (``dense_2``, ``dense_3``) come apart from
the model's tensors (``dense``).

The converter writes BERT's WordPiece vocabulary with llama.cpp's phantom spaces: a
word-initial piece ``w`` as ``▁w``, a continuation ``##w`` as ``w``, control tokens as
they are; ``tokenizer.ggml.normalizer.lowercase`` says whether text is lower-cased, and
``add_bos_token`` / ``add_eos_token`` put [CLS] first and [SEP] last. A (query,
document) pair is encoded as llama-server's rerank prompt, BOS query EOS [SEP] document
EOS (``add_sep_token`` for the middle [SEP]), the document's tokens of type 1 where the
model has two token types. A cross-encoder's head (``cls``, ``cls.output``) is read as
RoBERTa's classifier; the converter drops BERT's pooler, so a BERT cross-encoder's file
scores its [CLS] state with the projection alone, as llama.cpp does."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from engine.errors import CheckpointError
from engine.kernels.blocks import KEPT, BlockWeight
from engine.loading.gguf.encoder_names import ARCHS, hf_name
from engine.loading.gguf.header import read_header
from engine.loading.gguf.tokenizer import build_tokenizer

PHANTOM = "\u2581"
KIND = gguf.TokenType
CONTROL, NORMAL, USER_DEFINED = int(KIND.CONTROL), int(KIND.NORMAL), int(KIND.USER_DEFINED)
DENSE = ("dense_2", "dense_3")  # sentence-transformers Dense modules after pooling, in order


class EncoderFile:
    """Raises CheckpointError for a file that is not a GGUF encoder of ``ARCHS``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            header = read_header(self.path)
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable GGUF file: {exc}") from exc
        self.fields, self.tensors = header.fields, header.tensors
        arch, model = self.fields.get("general.architecture"), self.fields.get("tokenizer.ggml.model")
        if arch not in ARCHS:
            served = ", ".join(ARCHS)
            raise CheckpointError(f"{path}: GGUF architecture '{arch}' is not an encoder slotserve serves ({served})")
        self.arch = arch
        if model not in ("bert", "t5", "gpt2", "llama"):
            why = "expected bert (WordPiece), t5 (SentencePiece Unigram), gpt2 (byte-level BPE)"
            why += " or llama (SentencePiece BPE)"
            raise CheckpointError(f"{path}: tokenizer model '{model}' ({why})")

    def config(self) -> dict[str, Any]:
        """config.json's fields for engine/models/bert.py (nomic_bert.py)."""
        f = self.fields
        types = self.tensors.get("token_types.weight")
        if self.arch == "modern-bert":
            return self._modern_config()
        if self.arch == "gemma-embedding":
            return self._gemma_config()
        if self.arch == "nomic-bert":
            a = "nomic-bert"
            return {
                "architectures": ["NomicBertModel"],
                "vocab_size": len(f["tokenizer.ggml.tokens"]),
                "n_embd": int(f[f"{a}.embedding_length"]),
                "n_layer": int(f[f"{a}.block_count"]),
                "n_head": int(f[f"{a}.attention.head_count"]),
                "n_inner": int(f[f"{a}.feed_forward_length"]),
                "n_positions": int(f[f"{a}.context_length"]),
                "layer_norm_epsilon": float(f.get(f"{a}.attention.layer_norm_epsilon", 1e-12)),
                "rotary_emb_base": float(f.get(f"{a}.rope.freq_base", 1000.0)),
                "type_vocab_size": types.shape[0] if types else 1,
                "pad_token_id": int(f.get("tokenizer.ggml.padding_token_id", 0)),
            }
        head = self.tensors.get("cls.output.weight")  # a cross-encoder's classifier
        return self._labels() | {
            "architectures": ["BertForSequenceClassification" if head else "BertModel"],
            "vocab_size": len(f["tokenizer.ggml.tokens"]),
            "hidden_size": int(f["bert.embedding_length"]),
            "num_hidden_layers": int(f["bert.block_count"]),
            "num_attention_heads": int(f["bert.attention.head_count"]),
            "intermediate_size": int(f["bert.feed_forward_length"]),
            "max_position_embeddings": int(f["bert.context_length"]),
            "layer_norm_eps": float(f.get("bert.attention.layer_norm_epsilon", 1e-12)),
            "type_vocab_size": types.shape[0] if types else 1,
            "pad_token_id": int(f.get("tokenizer.ggml.padding_token_id", 0)),
            "hidden_act": "gelu",
        }

    def _labels(self) -> dict[str, Any]:
        """A cross-encoder's ``id2label`` (as many as ``cls.output`` has rows), else nothing."""
        head = self.tensors.get("cls.output.weight")
        return {"id2label": {str(i): f"LABEL_{i}" for i in range(head.shape[0])}} if head else {}

    def _modern_config(self) -> dict[str, Any]:
        """ModernBERT's config.json fields (engine/models/modernbert.py) from ``modern-bert.*``."""
        f, a, t = self.fields, "modern-bert", self.tensors
        head = t.get("cls.output.weight")
        eps = f.get(f"{a}.attention.layer_norm_rms_epsilon", f.get(f"{a}.attention.layer_norm_epsilon", 1e-5))
        return self._labels() | {
            "architectures": ["ModernBertForSequenceClassification" if head else "ModernBertModel"],
            "vocab_size": len(f["tokenizer.ggml.tokens"]),
            "hidden_size": int(f[f"{a}.embedding_length"]),
            "num_hidden_layers": int(f[f"{a}.block_count"]),
            "num_attention_heads": int(f[f"{a}.attention.head_count"]),
            "intermediate_size": int(f[f"{a}.feed_forward_length"]),
            "max_position_embeddings": int(f[f"{a}.context_length"]),
            "norm_eps": float(eps),
            "norm_bias": "token_embd_norm.bias" in t,
            "attention_bias": "blk.0.attn_qkv.bias" in t,
            "mlp_bias": "blk.0.ffn_up.bias" in t,
            "classifier_bias": "cls.bias" in t,
            "local_attention": int(f.get(f"{a}.attention.sliding_window", 128)),
            "global_attn_every_n_layers": int(f.get(f"{a}.attention.sliding_window_pattern", 3)),
            "global_rope_theta": float(f.get(f"{a}.rope.freq_base", 160_000.0)),
            "local_rope_theta": float(f.get(f"{a}.rope.freq_base_swa", 10_000.0)),
            "hidden_activation": f.get(f"{a}.hidden_activation") or "gelu",
            "classifier_pooling": {1: "mean"}.get(f.get(f"{a}.classifier.pooling_type"), "cls"),
            "pad_token_id": int(f.get("tokenizer.ggml.padding_token_id", 0)),
        }

    def _gemma_config(self) -> dict[str, Any]:
        """EmbeddingGemma's config.json fields (engine/models/embedding_gemma.py) from
        ``gemma-embedding.*``: scores scaled by the head size and every sixth layer global,
        as llama.cpp runs the file."""
        f, a = self.fields, "gemma-embedding"
        head_dim = int(f[f"{a}.attention.key_length"])
        return {
            "architectures": ["Gemma3TextModel"],
            "use_bidirectional_attention": True,
            "vocab_size": self.tensors["token_embd.weight"].shape[0],
            "hidden_size": int(f[f"{a}.embedding_length"]),
            "num_hidden_layers": int(f[f"{a}.block_count"]),
            "num_attention_heads": int(f[f"{a}.attention.head_count"]),
            "num_key_value_heads": int(f[f"{a}.attention.head_count_kv"]),
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
            "intermediate_size": int(f[f"{a}.feed_forward_length"]),
            "max_position_embeddings": int(f[f"{a}.context_length"]),
            "rms_norm_eps": float(f.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "sliding_window": int(f.get(f"{a}.attention.sliding_window", 512)),
            "sliding_window_pattern": int(f.get(f"{a}.attention.sliding_window_pattern", 6)),
            "rope_theta": float(f.get(f"{a}.rope.freq_base", 1_000_000.0)),
            "rope_local_base_freq": float(f.get(f"{a}.rope.freq_base_swa", 10_000.0)),
            "pad_token_id": int(f.get("tokenizer.ggml.padding_token_id", 0)),
        }

    def dense(self) -> list[torch.Tensor]:
        """The weights [out, in] of the file's Dense modules after pooling (``dense_2``,
        ``dense_3``: EmbeddingGemma's, written with the converter's
        ``--sentence-transformers-dense-modules``), float32, in order; [] when it has none."""
        out = []
        for name in DENSE:
            if f"{name}.weight" in self.tensors:
                out.append(self._read(f"{name}.weight"))
        return out

    def block_names(self) -> frozenset[str]:
        """Hugging Face names of the 2-D tensors stored in a type kept in blocks (F16,
        BF16, the quantized types: engine/kernels/blocks.py), which ``iter_tensors`` gives
        as the file's bytes."""
        return frozenset(
            target
            for name, (qtype, shape, *_) in self.tensors.items()
            if qtype in KEPT and len(shape) == 2 and (target := hf_name(name, self.arch)) is not None
        )

    def iter_tensors(self, blocks: bool = False) -> Iterator[tuple[str, str, torch.Tensor | BlockWeight]]:
        """(file, Hugging Face name, tensor) for every tensor the encoder reads: float32,
        or with ``blocks`` those of ``block_names`` as ``BlockWeight`` views of a private
        mapping of the file (its pages faulted in on use, handed back when packed)."""
        fd = os.open(self.path, os.O_RDONLY)
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) if blocks else None  # never written
        kept = self.block_names() if blocks else frozenset()
        try:
            for name, (qtype, shape, offset, n_bytes, _) in self.tensors.items():
                target = hf_name(name, self.arch)
                if target is None:
                    continue
                if offset + n_bytes > os.fstat(fd).st_size:
                    raise CheckpointError(f"{self.path}: tensor '{name}' is cut short (file truncated?)")
                if target in kept:
                    view = torch.frombuffer(mapped, dtype=torch.uint8, count=n_bytes, offset=offset)
                    yield self.path.name, target, BlockWeight.from_bytes(qtype, view, shape[0], shape[1], mapped=True)
                    continue
                values = self._read(name, fd)
                if self.arch == "gemma-embedding" and target.endswith("norm.weight"):
                    values -= 1.0  # the converter stores Gemma's 1 + w
                yield self.path.name, target, values
        finally:
            os.close(fd)

    def _read(self, name: str, fd: int | None = None) -> torch.Tensor:
        """The tensor ``name`` dequantized to float32, in its shape."""
        qtype, shape, offset, n_bytes = self.tensors[name][:4]
        own = fd is None
        fd = os.open(self.path, os.O_RDONLY) if own else fd
        try:
            buf = bytearray(n_bytes)
            if os.preadv(fd, [buf], offset) < n_bytes:
                raise CheckpointError(f"{self.path}: tensor '{name}' is cut short (file truncated?)")
        finally:
            if own:
                os.close(fd)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        raw = np.frombuffer(buf, dtype=np.uint8).reshape(rows, -1)
        values = gguf.quants.dequantize(raw, qtype).astype(np.float32)  # [rows, n]
        return torch.from_numpy(values.reshape(shape).copy())

    def tokenizer(self) -> HFTokenizer:
        """The tokenizer the file's vocabulary stands for: WordPiece (``bert``) or
        SentencePiece Unigram (``t5``: XLM-RoBERTa's), with its special tokens."""
        f = self.fields
        tokens, kinds = list(f["tokenizer.ggml.tokens"]), list(f.get("tokenizer.ggml.token_type") or [])
        kinds += [NORMAL] * (len(tokens) - len(kinds))
        model = f.get("tokenizer.ggml.model")
        if model in ("gpt2", "llama"):  # ModernBERT's byte-level BPE, Gemma's SentencePiece: as decoders
            tok, pieces = build_tokenizer(f, str(self.path)), tokens
        else:
            tok, pieces = self._unigram(tokens) if model == "t5" else self._wordpiece(tokens, kinds)
        first = self._special("bos", "[CLS]", pieces) if f.get("tokenizer.ggml.add_bos_token") else []
        last = self._special("eos", "[SEP]", pieces) if f.get("tokenizer.ggml.add_eos_token") else []
        sep = self._special("seperator", "[SEP]", pieces) if f.get("tokenizer.ggml.add_sep_token") else []
        if first or last or sep:
            second = ":1" if int(f.get("tokenizer.ggml.token_type_count", 1)) > 1 else ""  # the pair's B type
            a = [pieces[i] for i in first] + ["$A"] + [pieces[i] for i in last]
            b = [pieces[i] + second for i in sep] + ["$B" + second] + [pieces[i] + second for i in last]
            specials = [(pieces[i], i) for i in {*first, *last, *sep}]  # llama-server's pair: BOS a EOS [SEP] b EOS
            tok.post_processor = processors.TemplateProcessing(
                single=" ".join(a), pair=" ".join(a + b), special_tokens=specials
            )
        tok.add_special_tokens([p for p, k in zip(pieces, kinds) if k in (CONTROL, USER_DEFINED)])
        return tok

    def special_names(self) -> tuple[str | None, str | None]:
        """(BOS, EOS) token pieces as the file names them (None where it does not)."""
        tokens = self.fields.get("tokenizer.ggml.tokens") or []

        def piece(name: str) -> str | None:
            given = self.fields.get(f"tokenizer.ggml.{name}_token_id")
            return tokens[given] if isinstance(given, int) and 0 <= given < len(tokens) else None

        return piece("bos"), piece("eos")

    def _special(self, name: str, fallback: str, pieces: list[str]) -> list[int]:
        """[the id of the file's ``name`` token], else of the piece ``fallback`` (llama.cpp's
        BERT default), else []."""
        given = self.fields.get(f"tokenizer.ggml.{name}_token_id")
        if given is not None:
            return [int(given)]
        return [pieces.index(fallback)] if fallback in pieces else []

    def _wordpiece(self, tokens: list[str], kinds: list[int]) -> tuple[HFTokenizer, list[str]]:
        f = self.fields
        pieces = []
        for tok, kind in zip(tokens, kinds):
            if kind == CONTROL:
                pieces.append(tok)
            elif tok.startswith(PHANTOM):
                pieces.append(tok[len(PHANTOM) :])
            else:
                pieces.append("##" + tok)
        vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}  # a repeated piece: its first id
        unk = tokens[int(f.get("tokenizer.ggml.unknown_token_id", 0))]
        tok = HFTokenizer(models.WordPiece(vocab, unk_token=pieces[tokens.index(unk)]))
        tok.normalizer = normalizers.BertNormalizer(lowercase=bool(f.get("tokenizer.ggml.normalizer.lowercase", True)))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        return tok, pieces

    def _unigram(self, tokens: list[str]) -> tuple[HFTokenizer, list[str]]:
        """XLM-RoBERTa's as transformers converts its SentencePiece model: the charsmap's
        normalization, whitespace split, U+2581 for spaces (one in front)."""
        f = self.fields
        scores = list(f.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        unk = int(f.get("tokenizer.ggml.unknown_token_id", 0))
        tok = HFTokenizer(models.Unigram(list(zip(tokens, map(float, scores))), unk_id=unk, byte_fallback=False))
        charsmap = f.get("tokenizer.ggml.precompiled_charsmap")
        if charsmap:
            tok.normalizer = normalizers.Precompiled(bytes(np.asarray(charsmap, dtype=np.int64).astype(np.uint8)))
        prepend = "always" if f.get("tokenizer.ggml.add_space_prefix", True) else "never"
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=PHANTOM, prepend_scheme=prepend)]
        )
        tok.decoder = decoders.Metaspace(replacement=PHANTOM, prepend_scheme=prepend)
        return tok, tokens
