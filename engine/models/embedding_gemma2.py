"""EmbeddingGemma 2's text path (issue 54): transformers' ``EmbeddingGemma2Model`` (its
``text_config``; the vision and audio towers are not read: the server embeds text) or
``EmbeddingGemma2TextModel``. Gemma 4-style layers attending both ways: RMSNorms scaling
by ``w`` (v's without a scale), q/k/v norms and no score scale, the global layers with
their own head size and k/v heads (``per_layer_config``), the local ones seeing tokens
within ``sliding_window`` of their own (an inclusive radius); per-layer embeddings
projected from the token embeddings alone (``ple``: one slice per layer, gated into
the residual after the MLP), each layer's output times its ``layer_scalar``; the final
norm, then ``embedding_projection`` to ``embedding_dim`` per token (sentence-transformers
mean-pools and normalizes after it)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.embedding_gemma import GemmaBlock
from engine.models.encoder_base import EncoderModel, rope_table, rotate_halves, window_masks
from engine.models.gemma3n import Norm

SKIPPED = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")


def text_config(raw: dict) -> dict:
    """The text model's fields: ``text_config`` of the composite config, else ``raw``."""
    return raw.get("text_config") or raw


class _Attention(nn.Module):
    def __init__(self, cfg: dict, head_dim: int, n_kv: int):
        super().__init__()
        hidden, eps, bias = (
            int(cfg["hidden_size"]),
            float(cfg.get("rms_norm_eps", 1e-6)),
            bool(cfg.get("attention_bias")),
        )
        self.n_heads, self.n_kv, self.head_dim = int(cfg["num_attention_heads"]), n_kv, head_dim
        self.q_proj = nn.Linear(hidden, self.n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * head_dim, hidden, bias=bias)
        self.q_norm, self.k_norm = Norm(head_dim, eps), Norm(head_dim, eps)
        self.v_norm = Norm(head_dim, eps, with_scale=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos, sin [T, D]; mask [B, 1, T or 1, T] boolean (True: attend) -> [B, T, hidden]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)  # [B, KV, T, D]
        v = self.v_norm(self.v_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)  # [B, KV, T, D]
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))  # [B, T, hidden]


class _PleBlock(nn.Module):
    """Gates one layer's slice of the per-layer embeddings into the residual stream."""

    def __init__(self, cfg: dict, act):
        super().__init__()
        hidden, per_layer = int(cfg["hidden_size"]), int(cfg["hidden_size_per_layer_input"])
        self.act = act
        self.per_layer_input_gate = nn.Linear(hidden, per_layer, bias=False)
        self.per_layer_projection = nn.Linear(per_layer, hidden, bias=False)
        self.post_per_layer_input_norm = Norm(hidden, float(cfg.get("rms_norm_eps", 1e-6)))

    def forward(self, x: torch.Tensor, per_layer: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; per_layer [B, T, P] -> [B, T, hidden]."""
        h = self.per_layer_projection(self.act(self.per_layer_input_gate(x)) * per_layer)
        return x + self.post_per_layer_input_norm(h)


class _Layer(GemmaBlock):
    """Gemma 4's norms around the block, then the per-layer embedding and the layer's scalar."""

    def __init__(self, cfg: dict, head_dim: int, n_kv: int):
        super().__init__(cfg, _Attention(cfg, head_dim, n_kv), Norm)
        self.ple_block = _PleBlock(cfg, self.act)
        self.layer_scalar = nn.Parameter(torch.ones(1))  # a buffer in transformers, saved with the weights

    def forward(
        self, x: torch.Tensor, per_layer: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """x [B, T, hidden]; per_layer [B, T, P] -> [B, T, hidden]."""
        return self.ple_block(super().forward(x, cos, sin, mask), per_layer) * self.layer_scalar


class EmbeddingGemma2Encoder(EncoderModel):
    """No classifier head; ``forward`` answers the projected token states [B, T, embedding_dim]."""

    default_pooling = "mean"  # the model card's, when the folder has no sentence-transformers modules

    def __init__(self, raw: dict, kind: str = "embedding-gemma2", head: tuple[int, bool] | None = None):
        super().__init__()
        if head is not None:
            raise CheckpointError("EmbeddingGemma 2 has no classifier head")
        cfg = text_config(raw)
        hidden, n = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        self.pad_id = int(cfg.get("pad_token_id") or 0)
        self.kinds = list(cfg.get("layer_types") or [])
        if len(self.kinds) != n:
            raise CheckpointError("config.json: EmbeddingGemma 2 needs layer_types, one per layer")
        params = cfg.get("rope_parameters") or {}
        self.bases = {}
        for kind in set(self.kinds):
            given = params.get(kind) or {}
            if (given.get("rope_type") or "default") != "default":
                raise CheckpointError(
                    f"config.json: rope type '{given['rope_type']}' is not supported for EmbeddingGemma 2"
                )
            self.bases[kind] = float(given.get("rope_theta") or (1e6 if kind == "full_attention" else 1e4))
        self.radius = int(cfg.get("sliding_window") or 512)
        self.per_layer = int(cfg["hidden_size_per_layer_input"])
        self.scale = math.sqrt(hidden)
        self._limit = int(cfg.get("max_position_embeddings") or 8192)
        shapes = cfg.get("per_layer_config") or {}
        default = (int(cfg["head_dim"]), int(cfg["num_key_value_heads"]))
        self.head_dims = []
        layers = []
        for i in range(n):
            own = shapes.get(str(i)) or shapes.get(i) or {}
            head_dim, n_kv = int(own.get("head_dim", default[0])), int(own.get("num_key_value_heads", default[1]))
            self.head_dims.append(head_dim)
            layers.append(_Layer(cfg, head_dim, n_kv))
        self.embed_tokens = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = Norm(hidden, float(cfg.get("rms_norm_eps", 1e-6)))
        self.ple = nn.Module()
        self.ple.per_layer_model_projection = nn.Linear(hidden, n * self.per_layer, bias=False)
        self.ple.per_layer_projection_norm = Norm(self.per_layer, float(cfg.get("rms_norm_eps", 1e-6)))
        self.embedding_projection = nn.Linear(hidden, int(cfg["embedding_dim"]), bias=False)

    @property
    def max_positions(self) -> int:
        return self._limit

    def rename(self, name: str) -> str | None:
        name = name.removeprefix("model.")
        if name.startswith(SKIPPED):
            return None
        return name.removeprefix("language_model.")

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        b, t = ids.shape
        x = self.embed_tokens(ids) * self.scale  # [B, T, hidden]
        ple = self.ple.per_layer_model_projection(x) * self.scale**-1  # [B, T, L * P]
        ple = self.ple.per_layer_projection_norm(ple.view(b, t, len(self.layers), self.per_layer))  # [B, T, L, P]
        full, local = window_masks(lengths, t, self.radius)  # [B, 1, 1, T], [B, 1, T, T]
        tables = {}
        for i, (layer, kind) in enumerate(zip(self.layers, self.kinds)):
            key = (kind, self.head_dims[i])
            if key not in tables:
                tables[key] = rope_table(self.bases[kind], self.head_dims[i], t)  # [T, D] each
            x = layer(x, ple[:, :, i], *tables[key], local if kind == "sliding_attention" else full)
        return self.embedding_projection(self.norm(x))  # [B, T, embedding_dim]
