"""EmbeddingGemma (issue 54): Gemma 3 layers attending both ways. A published folder is
a ``Gemma3TextModel`` whose config says ``use_bidirectional_attention``; its layers are
Gemma 3's (RMSNorms scaling by ``1 + w`` before and after attention and MLP, q/k norms,
grouped k/v heads, scores scaled by ``query_pre_attn_scalar ** -0.5``, a gated
``gelu_pytorch_tanh`` MLP, embeddings times ``sqrt(hidden)``), every layer sees the
whole input, a local layer only the tokens within ``sliding_window // 2`` of its own
(transformers' ``(w // 2) + 1`` exclusive bound, llama.cpp's symmetric window). Global
and local layers turn by their own rotary bases. The sentence-transformers Dense
modules after pooling are the engine's (engine/core/encoder.py), not the model's.

The config is read as transformers 4 writes it (``rope_theta``, ``rope_local_base_freq``,
``rope_scaling``) or 5 (``rope_parameters`` per layer kind); the layer kinds from
``layer_types``, else every ``sliding_window_pattern``-th layer global."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.encoder_base import EncoderModel, rope_table, rotate_halves, window_masks
from engine.models.gemma import GemmaRMSNorm

ACTS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "silu": F.silu}


def layer_kinds(raw: dict) -> list[str]:
    """Each layer's attention: ``full_attention`` or ``sliding_attention``."""
    given = raw.get("layer_types")
    if given:
        return list(given)
    every = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
    n = int(raw["num_hidden_layers"])
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def rope_settings(raw: dict) -> dict[str, tuple[float, float]]:
    """(base, linear factor) of each layer kind's rotary positions; CheckpointError for a
    scaling other than linear."""
    params = raw.get("rope_parameters") or {}
    old_scaling = raw.get("rope_scaling") or {}

    def setting(kind: str, old_base: str, default: float, old: dict) -> tuple[float, float]:
        given = params.get(kind) or old
        kind_of = given.get("rope_type") or given.get("type") or "default"
        if kind_of not in ("default", "linear"):
            raise CheckpointError(f"config.json: rope type '{kind_of}' is not supported for EmbeddingGemma")
        base = given.get("rope_theta", raw.get(old_base) or default)
        return float(base), float(given.get("factor") or 1.0) if kind_of == "linear" else 1.0

    return {
        "full_attention": setting("full_attention", "rope_theta", 1_000_000.0, old_scaling),
        "sliding_attention": setting("sliding_attention", "rope_local_base_freq", 10_000.0, {}),
    }


class _Attention(nn.Module):
    def __init__(self, raw: dict):
        super().__init__()
        hidden, eps = int(raw["hidden_size"]), float(raw.get("rms_norm_eps", 1e-6))
        self.n_heads, self.n_kv = int(raw["num_attention_heads"]), int(raw["num_key_value_heads"])
        self.head_dim = int(raw.get("head_dim") or hidden // self.n_heads)
        bias = bool(raw.get("attention_bias"))
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps)
        self.scale = float(raw.get("query_pre_attn_scalar") or self.head_dim) ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos, sin [T, D]; mask [B, 1, T or 1, T] boolean (True: attend) -> [B, T, hidden]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)  # [B, KV, T, D]
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)  # [B, KV, T, D]
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))  # [B, T, hidden]


class GemmaBlock(nn.Module):
    """A Gemma layer around its ``self_attn``: norms before and after attention and the
    gated MLP (``norm``: the norm class, Gemma 3's 1 + w or Gemma 4's w)."""

    def __init__(self, raw: dict, attention: nn.Module, norm=GemmaRMSNorm):
        super().__init__()
        hidden, inner = int(raw["hidden_size"]), int(raw["intermediate_size"])
        eps = float(raw.get("rms_norm_eps", 1e-6))
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ACTS:
            raise CheckpointError(f"config.json: hidden_activation '{act}' is not supported for EmbeddingGemma")
        self.act = ACTS[act]
        self.self_attn = attention
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.mlp.up_proj = nn.Linear(hidden, inner, bias=False)
        self.mlp.down_proj = nn.Linear(inner, hidden, bias=False)
        self.input_layernorm = norm(hidden, eps)
        self.post_attention_layernorm = norm(hidden, eps)
        self.pre_feedforward_layernorm = norm(hidden, eps)
        self.post_feedforward_layernorm = norm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos, sin [T, D]; mask [B, 1, T or 1, T] boolean (True: attend) -> [B, T, hidden]."""
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        h = self.pre_feedforward_layernorm(x)
        h = self.mlp.down_proj(self.act(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))
        return x + self.post_feedforward_layernorm(h)


class EmbeddingGemmaEncoder(EncoderModel):
    """No classifier head: EmbeddingGemma embeds."""

    default_pooling = "mean"  # the model card's, when the folder has no sentence-transformers modules

    def __init__(self, raw: dict, kind: str = "embedding-gemma", head: tuple[int, bool] | None = None):
        super().__init__()
        if head is not None:
            raise CheckpointError("EmbeddingGemma has no classifier head")
        hidden = int(raw["hidden_size"])
        self.pad_id = int(raw.get("pad_token_id") or 0)
        self.kinds, self.ropes = layer_kinds(raw), rope_settings(raw)
        self.half_window = int(raw.get("sliding_window") or 512) // 2
        self.head_dim = int(raw.get("head_dim") or hidden // int(raw["num_attention_heads"]))
        self.scale = math.sqrt(hidden)
        self._limit = int(raw.get("max_position_embeddings") or 2048)
        self.embed_tokens = nn.Embedding(int(raw["vocab_size"]), hidden)
        self.layers = nn.ModuleList(GemmaBlock(raw, _Attention(raw)) for _ in range(int(raw["num_hidden_layers"])))
        self.norm = GemmaRMSNorm(hidden, float(raw.get("rms_norm_eps", 1e-6)))

    @property
    def max_positions(self) -> int:
        return self._limit

    def rename(self, name: str) -> str | None:
        return None if name.startswith("lm_head.") else name.removeprefix("model.")

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        t = ids.shape[1]
        x = self.embed_tokens(ids) * self.scale  # [B, T, hidden]
        full, local = window_masks(lengths, t, self.half_window)  # [B, 1, 1, T], [B, 1, T, T]
        tables = {kind: rope_table(base, self.head_dim, t, factor) for kind, (base, factor) in self.ropes.items()}
        for layer, kind in zip(self.layers, self.kinds):
            x = layer(x, *tables[kind], local if kind == "sliding_attention" else full)
        return self.norm(x)
