"""IBM Granite 4.0 hybrids (``GraniteMoeHybridForCausalLM``): most layers a Mamba2
mixer, a few attention layers (no positional encoding when ``position_embedding_type``
is null, as in the released models; rope otherwise), and after each mixer a sparse MoE
plus a shared gated MLP. Granite's scalars: embeddings times ``embedding_multiplier``,
each residual branch times ``residual_multiplier``, attention scores times
``attention_multiplier`` (instead of 1/sqrt(d)), logits divided by ``logits_scaling``.

Memory: a ``RecurrentSpec`` for the Mamba layers and a ``FullAttentionSpec`` for the
attention ones, composed by the hybrid memory. Weight names follow the checkpoint
(``block_sparse_moe.input_linear`` and ``router.layer`` are the file's names).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import CheckpointError
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, embedding
from engine.models.mamba2 import Mamba2Mixer, SSMShape
from engine.models.moe import SparseMoE
from engine.models.rope import Rotary, rotate
from memory import ForwardView, FullAttentionSpec, LayerSpec


class GraniteAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, scale: float):
        super().__init__()
        self.layer, self.scale = layer, scale
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple | None, view: ForwardView) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.n_heads, self.d)  # [T, H, D]
        k = self.k_proj(x).view(n, self.n_kv, self.d)  # [T, KVH, D]
        v = self.v_proj(x).view(n, self.n_kv, self.d)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        out = view.attend(self.layer, q, k, v, scale=self.scale)  # [T, H, D]
        return self.o_proj(out.reshape(n, self.n_heads * self.d))


class SharedMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.ffn = ffn
        self.input_linear = nn.Linear(hidden, 2 * ffn, bias=False)
        self.output_linear = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).split(self.ffn, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class GraniteHybridLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, ssm: SSMShape, scales: dict):
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.residual = scales["residual"]
        self.input_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        if cfg.layer_types[layer] == "recurrent":
            self.mamba = Mamba2Mixer(ssm, layer)
        else:
            self.self_attn = GraniteAttention(cfg, layer, scales["attention"])
        n_experts = int(raw.get("num_local_experts") or 0)
        if n_experts > 0:
            top_k = int(raw.get("num_experts_per_tok") or 2)
            self.block_sparse_moe = SparseMoE(hidden, cfg.intermediate_size, n_experts, top_k)
        self.shared_mlp = SharedMLP(hidden, int(raw.get("shared_intermediate_size") or cfg.intermediate_size))

    def forward(self, x: torch.Tensor, rope: tuple | None, view: ForwardView) -> torch.Tensor:
        h = self.input_layernorm(x)
        h = self.mamba(h, view) if hasattr(self, "mamba") else self.self_attn(h, rope, view)
        x = x + h * self.residual
        h = self.post_attention_layernorm(x)
        mlp = self.shared_mlp(h)
        if hasattr(self, "block_sparse_moe"):
            mlp = self.block_sparse_moe(h) + mlp
        return x + mlp * self.residual


class GraniteMoeHybridForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw = cfg.raw
        if "recurrent" in cfg.layer_types:
            self.ssm = SSMShape.from_raw(raw, cfg.hidden_size, prefix="mamba_")
        num = lambda key: float(raw.get(key) if raw.get(key) is not None else 1.0)  # noqa: E731
        scales = {"residual": num("residual_multiplier"), "attention": num("attention_multiplier")}
        self.embedding_multiplier, self.logits_scaling = num("embedding_multiplier"), num("logits_scaling")
        self.use_rope = raw.get("position_embedding_type") == "rope"
        if raw.get("position_embedding_type") not in (None, "rope", "nope"):
            raise CheckpointError(
                f"config.json: field 'position_embedding_type' is {raw['position_embedding_type']!r}; "
                "supported: null (none) or 'rope'"
            )
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(
            GraniteHybridLayer(cfg, i, getattr(self, "ssm", None), scales) for i in range(cfg.n_layers)
        )
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)

    def init_buffers(self, device: torch.device) -> None:
        self.rotary = Rotary(self.cfg.rope, self.cfg.head_dim, self.cfg.max_position_embeddings).to(device)

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        return [
            self.ssm.spec(dtype) if kind == "recurrent" else FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype)
            for kind in cfg.layer_types
        ]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if not self.use_rope:
            return k  # keys carry no position
        cos, sin = self.rotary.cos_sin(delta, scaled=False)
        return rotate(k.float(), cos, sin).to(k.dtype)

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.model.embed_tokens(input_ids) * self.embedding_multiplier  # [T, hidden]
        rope = self.rotary.cos_sin(positions) if self.use_rope else None
        for layer in self.model.layers:
            x = layer(x, rope, view)
        return self.model.norm(x[rows])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x).float() / self.logits_scaling  # [S, vocab]
