"""BERT-family encoders (issue 54): BERT (``BertModel``) and XLM-RoBERTa / RoBERTa
(``XLMRobertaModel``, ``RobertaModel``): bidirectional attention over the whole input,
absolute learned positions (RoBERTa's counted from ``pad_token_id + 1``), token-type
embeddings, post-layer-norm blocks with biases everywhere and an exact (erf) GELU MLP.
No cache and no slots: a batch of inputs, padded to its longest, is one forward pass
(engine/core/encoder.py schedules them).

Module names are the checkpoints' own (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query``, ...), so a folder loads name for name; a
``bert.`` / ``roberta.`` prefix (a task model's base) is dropped. A sequence classifier
(a cross-encoder reranker: ``*ForSequenceClassification``) keeps its head over the first
token: BERT's pooler (dense, tanh) and ``classifier``; RoBERTa's ``classifier.dense``
(tanh) and ``classifier.out_proj``. Other models read neither pooler nor head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.encoder_base import EncoderModel

PREFIXES = ("bert.", "roberta.")
SKIPPED = ("pooler.", "classifier.", "cls.", "lm_head.", "embeddings.position_ids", "embeddings.token_type_ids")
HEAD_NAMES = {  # a classifier's tensors -> the head's (BERT's pooler is its dense layer)
    "pooler.dense.": "head.dense.",
    "classifier.dense.": "head.dense.",
    "classifier.out_proj.": "head.out_proj.",
    "classifier.weight": "head.out_proj.weight",
    "classifier.bias": "head.out_proj.bias",
}


def n_labels(raw: dict) -> int:
    """How many labels a classifier config names (transformers' rule: ``id2label``'s
    length, else ``num_labels``, else 2)."""
    labels = raw.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else int(raw.get("num_labels") or 2)


class _Embeddings(nn.Module):
    def __init__(self, raw: dict):
        super().__init__()
        hidden = int(raw["hidden_size"])
        self.word_embeddings = nn.Embedding(int(raw["vocab_size"]), hidden)
        self.position_embeddings = nn.Embedding(int(raw["max_position_embeddings"]), hidden)
        self.token_type_embeddings = nn.Embedding(int(raw.get("type_vocab_size") or 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=float(raw.get("layer_norm_eps", 1e-12)))


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))


class _Output(nn.Module):  # dense + dropout (none here) + LayerNorm over the residual
    def __init__(self, n_in: int, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(n_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Layer(nn.Module):
    def __init__(self, raw: dict):
        super().__init__()
        hidden, eps = int(raw["hidden_size"]), float(raw.get("layer_norm_eps", 1e-12))
        self.n_heads = int(raw["num_attention_heads"])
        self.attention = nn.Module()
        self.attention.self = _SelfAttention(hidden)
        self.attention.output = _Output(hidden, hidden, eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(hidden, int(raw["intermediate_size"]))
        self.output = _Output(int(raw["intermediate_size"]), hidden, eps)
        act = raw.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise CheckpointError(f"config.json: hidden_act '{act}' is not supported for encoders")
        self.act = act

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; mask [B, 1, 1, T] additive (0 or -inf at padding) -> [B, T, hidden]."""
        b, t, hidden = x.shape
        attn = self.attention.self
        q, k, v = (m(x).view(b, t, self.n_heads, -1).transpose(1, 2) for m in (attn.query, attn.key, attn.value))
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, T, D]
        h = self.attention.output(ctx.transpose(1, 2).reshape(b, t, hidden), x)
        inner = self.intermediate.dense(h)
        if self.act == "relu":
            inner = F.relu(inner)
        else:
            inner = F.gelu(inner, approximate="none" if self.act == "gelu" else "tanh")
        return self.output(inner, h)


class _Head(nn.Module):
    """A sequence classifier's head: [dense, tanh,] out_proj."""

    def __init__(self, hidden: int, n_labels: int, dense: bool):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden) if dense else None
        self.out_proj = nn.Linear(hidden, n_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, hidden] (the first token's state) -> logits [B, n_labels]."""
        if self.dense is not None:
            x = torch.tanh(self.dense(x))
        return self.out_proj(x)


class BertEncoder(EncoderModel):
    """``last_hidden_state`` of BERT / XLM-RoBERTa for a padded batch; ``head``: a
    classifier's (n_labels, whether it has a dense layer before the projection; a GGUF
    BERT classifier has none: the converter drops the pooler)."""

    def __init__(self, raw: dict, kind: str, head: tuple[int, bool] | None = None):
        super().__init__()
        if raw.get("position_embedding_type", "absolute") not in ("absolute", None):
            raise CheckpointError(f"config.json: position_embedding_type '{raw['position_embedding_type']}'")
        self.kind, self.pad_id = kind, int(raw.get("pad_token_id") or 0)
        self.embeddings = _Embeddings(raw)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(_Layer(raw) for _ in range(int(raw["num_hidden_layers"])))
        self.head = _Head(int(raw["hidden_size"]), *head) if head is not None else None

    @property
    def max_positions(self) -> int:
        """The longest input the position table takes (RoBERTa's first pad_id + 1 rows unused)."""
        n = self.embeddings.position_embeddings.num_embeddings
        return n - self.pad_id - 1 if self.kind == "roberta" else n

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, T] (padded on the right), lengths [B] -> last hidden states [B, T, hidden]
        (rows past a sequence's length are padding's, never read by pooling)."""
        b, t = ids.shape
        valid = torch.arange(t)[None, :] < lengths[:, None]  # [B, T]
        pos = torch.arange(t).expand(b, t)
        if self.kind == "roberta":  # RoBERTa counts positions after the padding id
            pos = pos + self.pad_id + 1
        emb = self.embeddings
        types = torch.zeros_like(ids) if type_ids is None else type_ids
        x = emb.word_embeddings(ids) + emb.position_embeddings(pos) + emb.token_type_embeddings(types)
        x = emb.LayerNorm(x)  # [B, T, hidden]
        mask = torch.zeros(b, 1, 1, t).masked_fill(~valid[:, None, None, :], float("-inf"))
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x

    def rename(self, name: str) -> str | None:
        """A task model's ``bert.`` / ``roberta.`` prefix dropped; a classifier's head
        tensors under ``head.``; the pooler and other heads not read (None)."""
        for prefix in PREFIXES:
            name = name.removeprefix(prefix)
        if self.head is not None:
            name = next((new + name[len(old) :] for old, new in HEAD_NAMES.items() if name.startswith(old)), name)
        return None if name.startswith(SKIPPED) else name
