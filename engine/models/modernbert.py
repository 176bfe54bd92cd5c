"""ModernBERT (issue 54): pre-layer-norm blocks (the first without its attention norm),
no biases by default, a fused q/k/v projection (``attn.Wqkv``), rotary positions whose
base differs between global layers (every ``global_attn_every_n_layers``-th, from the
first) and local ones, which see only tokens within ``local_attention // 2`` of their
own; a GeGLU MLP, ``Wo(gelu(a) * b)`` for ``a, b = Wi(x)`` halves; token embeddings and
LayerNorm in front, a final LayerNorm. A sequence classifier pools (``cls`` or ``mean``,
``classifier_pooling``), then runs its head (dense, GELU, LayerNorm) and ``classifier``.

The config is read as published (``global_attn_every_n_layers``, ``global_rope_theta``,
``local_rope_theta``) or as transformers 5 writes it (``layer_types``,
``rope_parameters``); tensors by the checkpoints' names (``model.`` dropped)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.encoder_base import EncoderModel, rope_table, rotate_halves, window_masks

SKIPPED = ("head.", "decoder.", "classifier.", "lm_head.")
ACTS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}  # fmt: skip


def _norm(raw: dict) -> nn.LayerNorm:
    return nn.LayerNorm(int(raw["hidden_size"]), eps=float(raw.get("norm_eps", 1e-5)), bias=bool(raw.get("norm_bias")))


def layer_kinds(raw: dict) -> list[str]:
    """Each layer's attention: ``full_attention`` or ``sliding_attention``."""
    n = int(raw["num_hidden_layers"])
    given = raw.get("layer_types")
    if given:
        return list(given)
    every = int(raw.get("global_attn_every_n_layers") or 3)
    return ["sliding_attention" if i % every else "full_attention" for i in range(n)]


def rope_bases(raw: dict) -> dict[str, float]:
    params = raw.get("rope_parameters") or {}

    def base(kind: str, old: str, default: float) -> float:
        given = (params.get(kind) or {}).get("rope_theta")
        return float(given if given is not None else raw.get(old) or default)

    return {
        "full_attention": base("full_attention", "global_rope_theta", 160_000.0),
        "sliding_attention": base("sliding_attention", "local_rope_theta", 10_000.0),
    }


class _Head(nn.Module):
    """A classifier's head: dense, GELU, LayerNorm, then ``classifier`` [n_labels]."""

    def __init__(self, raw: dict, n_labels: int):
        super().__init__()
        hidden = int(raw["hidden_size"])
        self.dense = nn.Linear(hidden, hidden, bias=bool(raw.get("classifier_bias")))
        self.norm = _norm(raw)
        self.classifier = nn.Linear(hidden, n_labels)
        self.act = ACTS[raw.get("classifier_activation") or "gelu"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, hidden] (pooled) -> logits [B, n_labels]."""
        return self.classifier(self.norm(self.act(self.dense(x))))


class _Layer(nn.Module):
    def __init__(self, raw: dict, first: bool):
        super().__init__()
        hidden, inner = int(raw["hidden_size"]), int(raw["intermediate_size"])
        self.n_heads = int(raw["num_attention_heads"])
        self.attn_norm = nn.Identity() if first else _norm(raw)
        self.attn = nn.Module()
        self.attn.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bool(raw.get("attention_bias")))
        self.attn.Wo = nn.Linear(hidden, hidden, bias=bool(raw.get("attention_bias")))
        self.mlp_norm = _norm(raw)
        self.mlp = nn.Module()
        self.mlp.Wi = nn.Linear(hidden, 2 * inner, bias=bool(raw.get("mlp_bias")))
        self.mlp.Wo = nn.Linear(inner, hidden, bias=bool(raw.get("mlp_bias")))
        act = raw.get("hidden_activation") or "gelu"
        if act not in ACTS:
            raise CheckpointError(f"config.json: hidden_activation '{act}' is not supported for ModernBERT")
        self.act = ACTS[act]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos, sin [T, D]; mask [B, 1, T or 1, T] boolean (True: attend) -> [B, T, hidden]."""
        b, t, hidden = x.shape
        q, k, v = self.attn.Wqkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)  # [B, H, T, D]
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, T, D]
        x = x + self.attn.Wo(ctx.transpose(1, 2).reshape(b, t, hidden))
        a, g = self.mlp.Wi(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp.Wo(self.act(a) * g)


class ModernBertEncoder(EncoderModel):
    """``head``: (n_labels, _) for a sequence classifier (its pooling: ``classifier_pooling``)."""

    def __init__(self, raw: dict, kind: str = "modernbert", head: tuple[int, bool] | None = None):
        super().__init__()
        hidden = int(raw["hidden_size"])
        self.pad_id = int(raw.get("pad_token_id") or 0)
        self.kinds, self.bases = layer_kinds(raw), rope_bases(raw)
        self.half_window = int(raw.get("local_attention") or 128) // 2
        self.head_dim = hidden // int(raw["num_attention_heads"])
        self._limit = int(raw.get("max_position_embeddings") or 8192)
        self.pool = raw.get("classifier_pooling") or "cls"
        self.embeddings = nn.Module()
        self.embeddings.tok_embeddings = nn.Embedding(int(raw["vocab_size"]), hidden)
        self.embeddings.norm = _norm(raw)
        self.layers = nn.ModuleList(_Layer(raw, i == 0) for i in range(int(raw["num_hidden_layers"])))
        self.final_norm = _norm(raw)
        self.head = _Head(raw, head[0]) if head is not None else None

    @property
    def max_positions(self) -> int:
        return self._limit

    @property
    def n_labels(self) -> int:
        return 0 if self.head is None else self.head.classifier.out_features

    def rename(self, name: str) -> str | None:
        name = name.removeprefix("model.")
        if self.head is not None and name.startswith(("head.", "classifier.")):
            return "head." + name.removeprefix("head.")
        return None if name.startswith(SKIPPED) else name

    def classify(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The head's logits [B, n_labels] from last hidden states [B, T, hidden]: pooled
        as ``classifier_pooling`` says (the mean over each input's own tokens, or its first)."""
        if self.pool == "mean":
            valid = (torch.arange(hidden.shape[1])[None, :] < lengths[:, None]).float()  # [B, T]
            pooled = (hidden * valid[..., None]).sum(1) / lengths[:, None].float()
        else:
            pooled = hidden[:, 0]
        return self.head(pooled)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        t = ids.shape[1]
        emb = self.embeddings
        x = emb.norm(emb.tok_embeddings(ids))  # [B, T, hidden]
        full, local = window_masks(lengths, t, self.half_window)  # [B, 1, 1, T], [B, 1, T, T]
        tables = {kind: rope_table(base, self.head_dim, t) for kind, base in self.bases.items()}  # [T, D] each
        for layer, kind in zip(self.layers, self.kinds):
            x = layer(x, *tables[kind], local if kind == "sliding_attention" else full)
        return self.final_norm(x)
