"""nomic-bert (issue 54): nomic-embed-text's encoder. Post-layer-norm blocks without
biases: a fused q/k/v projection (``attn.Wqkv``), rotary positions (not interleaved,
base ``rotary_emb_base``), the output projection, LayerNorm over the residual
(``norm1``); a SwiGLU MLP, ``fc2(fc11(x) * silu(fc12(x)))``, LayerNorm over the residual
(``norm2``). Word and token-type embeddings, LayerNorm (``emb_ln``); no position table.

The config is read as the published folders write it (``n_embd``, ``n_head``,
``n_layer``, ``n_inner``, ``n_positions`` / ``max_trained_positions``, ...) or as
transformers 5 writes it (``hidden_size``, ``num_attention_heads``, ...); tensors by the
published names, which transformers 5 also saves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.encoder_base import EncoderModel, rope_table, rotate_halves

SKIPPED = ("lm_head.", "cls.", "pooler.", "embeddings.position_ids", "embeddings.token_type_ids")


def field(raw: dict, *names: str, default=None):
    """The first of ``names`` the config has (published names first)."""
    for name in names:
        if raw.get(name) is not None:
            return raw[name]
    if default is None:
        raise CheckpointError(f"config.json: none of {', '.join(names)}")
    return default


def max_positions(raw: dict) -> int:
    """The input limit: the positions it was trained for (nomic-embed-text v1 / v1.5:
    ``max_trained_positions`` 2048 of ``n_positions`` 8192, as llama.cpp's converter
    reads them), else transformers' ``max_position_embeddings``."""
    trained = raw.get("max_trained_positions")
    n = raw.get("n_positions")
    if trained is not None and n is not None:
        return min(int(trained), int(n))
    return int(field(raw, "n_positions", "max_position_embeddings", default=2048))


def check(raw: dict) -> None:
    """CheckpointError for a nomic-bert variant this module does not compute."""
    act = field(raw, "activation_function", "hidden_act", default="swiglu")
    wanted = {"prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "causal": False}
    wanted |= {"qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "moe_every_n_layers": 0}
    odd = [k for k, v in wanted.items() if raw.get(k) not in (None, v)]
    if act not in ("swiglu", "silu") or odd:
        raise CheckpointError(f"config.json: a nomic-bert variant not served ({', '.join(odd) or act})")


class _Layer(nn.Module):
    def __init__(self, hidden: int, n_heads: int, inner: int, eps: float):
        super().__init__()
        self.n_heads = n_heads
        self.attn = nn.Module()
        self.attn.Wqkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attn.out_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Module()
        self.mlp.fc11 = nn.Linear(hidden, inner, bias=False)  # up
        self.mlp.fc12 = nn.Linear(hidden, inner, bias=False)  # gate
        self.mlp.fc2 = nn.Linear(inner, hidden, bias=False)
        self.norm1, self.norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos, sin [T, D]; mask [B, 1, 1, T] additive -> [B, T, hidden]."""
        b, t, hidden = x.shape
        q, k, v = self.attn.Wqkv(x).view(b, t, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, T, D]
        h = self.norm1(x + self.attn.out_proj(ctx.transpose(1, 2).reshape(b, t, hidden)))
        mlp = self.mlp
        return self.norm2(h + mlp.fc2(mlp.fc11(h) * F.silu(mlp.fc12(h))))


class NomicBertEncoder(EncoderModel):
    def __init__(self, raw: dict, kind: str = "nomic", head: tuple[int, bool] | None = None):
        super().__init__()
        check(raw)
        if head is not None:
            raise CheckpointError("config.json: a nomic-bert classifier is not served")
        hidden = int(field(raw, "n_embd", "hidden_size"))
        n_heads = int(field(raw, "n_head", "num_attention_heads"))
        inner = int(field(raw, "n_inner", "intermediate_size"))
        eps = float(field(raw, "layer_norm_epsilon", "layer_norm_eps", default=1e-12))
        rope = raw.get("rope_parameters") or {}
        self.base = float(field(raw, "rotary_emb_base", "rope_theta", default=rope.get("rope_theta") or 1000.0))
        self.pad_id, self.head_dim = int(raw.get("pad_token_id") or 0), hidden // n_heads
        self._limit = max_positions(raw)
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(int(raw["vocab_size"]), hidden)
        self.embeddings.token_type_embeddings = nn.Embedding(int(raw.get("type_vocab_size") or 2), hidden)
        self.emb_ln = nn.LayerNorm(hidden, eps=eps)
        self.encoder = nn.Module()
        layers = int(field(raw, "n_layer", "num_hidden_layers"))
        self.encoder.layers = nn.ModuleList(_Layer(hidden, n_heads, inner, eps) for _ in range(layers))

    @property
    def max_positions(self) -> int:
        return self._limit

    def rename(self, name: str) -> str | None:
        name = name.removeprefix("nomic_bert.")
        return None if name.startswith(SKIPPED) else name

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        b, t = ids.shape
        valid = torch.arange(t)[None, :] < lengths[:, None]  # [B, T]
        emb = self.embeddings
        types = torch.zeros_like(ids) if type_ids is None else type_ids
        x = self.emb_ln(emb.word_embeddings(ids) + emb.token_type_embeddings(types))  # [B, T, hidden]
        cos, sin = rope_table(self.base, self.head_dim, t)  # [T, D] each
        mask = torch.zeros(b, 1, 1, t).masked_fill(~valid[:, None, None, :], float("-inf"))
        for layer in self.encoder.layers:
            x = layer(x, cos, sin, mask)
        return x
