"""Falcon-H1 (``FalconH1ForCausalLM``): in every layer, attention and a Mamba2 mixer side
by side on the same normed input, their outputs summed into the residual, then a gated
MLP. Falcon's muP scalars: embeddings times ``embedding_multiplier``, logits times
``lm_head_multiplier``, keys times ``key_multiplier``, the attention branch's input and
output times ``attention_in/out_multiplier``, the mixer's input and output times
``ssm_in/out_multiplier`` and its input projection per section times
``ssm_multipliers`` (gate, x, B, C, dt), the MLP's gate and output times
``mlp_multipliers``.

Memory: every layer has both a KV cache and a recurrent state, so the model declares
2 x L memory layers: attention at ids 0..L-1, the mixers' states at L..2L-1 (the hybrid
memory keys its halves by those ids).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, embedding
from engine.models.mamba2 import Mamba2Mixer, SSMShape
from engine.models.rope import Rotary, rotate
from memory import ForwardView, FullAttentionSpec, LayerSpec


def _num(raw: dict, key: str, default: float = 1.0) -> float:
    return float(raw[key]) if raw.get(key) is not None else default


class FalconAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.key_scale = _num(cfg.raw, "key_multiplier")
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        n = x.shape[0]
        q = rotate(self.q_proj(x).view(n, self.n_heads, self.d), cos, sin)  # [T, H, D]
        k = rotate(self.k_proj(x).view(n, self.n_kv, self.d) * self.key_scale, cos, sin)  # [T, KVH, D]
        v = self.v_proj(x).view(n, self.n_kv, self.d)
        return self.o_proj(view.attend(self.layer, q, k, v).reshape(n, self.n_heads * self.d))


class FalconMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden, ffn, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_scale, self.down_scale = (float(m) for m in (cfg.raw.get("mlp_multipliers") or (1.0, 1.0)))
        self.gate_proj = nn.Linear(hidden, ffn, bias=bias)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up_proj(x) * F.silu(self.gate_proj(x) * self.gate_scale)
        return self.down_proj(y) * self.down_scale


class FalconH1Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, ssm: SSMShape):
        super().__init__()
        raw = cfg.raw
        self.attn_in, self.attn_out = _num(raw, "attention_in_multiplier"), _num(raw, "attention_out_multiplier")
        self.ssm_out = _num(raw, "ssm_out_multiplier")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mamba = Mamba2Mixer(ssm, cfg.n_layers + layer, in_scale=_num(raw, "ssm_in_multiplier"))
        self.self_attn = FalconAttention(cfg, layer)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = FalconMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        h = self.input_layernorm(x)
        mixed = self.mamba(h, view) * self.ssm_out
        attended = self.self_attn(h * self.attn_in, cos, sin, view) * self.attn_out
        x = x + (mixed + attended)
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class FalconH1ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw = cfg.raw
        norm = (
            ("norm_then_gate" if raw.get("mamba_norm_before_gate", True) else "gate_then_norm")
            if raw.get("mamba_rms_norm")
            else "gate"
        )
        base = SSMShape.from_raw(raw, cfg.hidden_size, prefix="mamba_")
        self.ssm = SSMShape(**{**base.__dict__, "norm": norm, "out_bias": bool(raw.get("projectors_bias", False))})
        self.embedding_multiplier = _num(raw, "embedding_multiplier")
        self.lm_head_multiplier = _num(raw, "lm_head_multiplier")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(FalconH1Layer(cfg, i, self.ssm) for i in range(cfg.n_layers))
        self.model.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)

    def init_buffers(self, device: torch.device) -> None:
        """Rotary frequencies and the mixers' per-section input multipliers (computed, not loaded)."""
        cfg, s = self.cfg, self.ssm
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings).to(device)
        gate, x, b, c, dt = (float(m) for m in (cfg.raw.get("ssm_multipliers") or (1.0,) * 5))
        bc = s.n_groups * s.state_size
        sections = [(s.inner, gate), (s.inner, x), (bc, b), (bc, c), (s.n_heads, dt)]
        mup = torch.cat([torch.full((n,), m) for n, m in sections]).to(device)  # [inner + conv_dim + heads]
        for layer in self.model.layers:
            layer.mamba.mup = mup

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        attention = [FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype) for _ in range(cfg.n_layers)]
        return attention + [self.ssm.spec(dtype) for _ in range(cfg.n_layers)]

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.model.embed_tokens(input_ids) * self.embedding_multiplier  # [T, hidden]
        cos, sin = self.rotary.cos_sin(positions)
        for layer in self.model.layers:
            x = layer(x, cos, sin, view)
        return self.model.final_layernorm(x[rows])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lm_head(x) * self.lm_head_multiplier).float()  # [S, vocab]
