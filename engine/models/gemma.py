"""Gemma 2 and Gemma 3 (text): the Llama skeleton with Gemma's differences.

- RMSNorm scales by ``1 + weight`` (computed in float32); four norms per layer (before
  and after attention, before and after the MLP).
- Embeddings are multiplied by sqrt(hidden); the MLP uses tanh-approximated GELU.
- Scores are scaled by ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps attention
  scores (``attn_logit_softcapping``) and the final logits (``final_logit_softcapping``).
- Layers alternate sliding-window and global attention (``layer_types``); the memory
  gives the sliding ones a window-sized cache.
- Gemma 3 adds per-head q/k norms and a separate rope for sliding layers
  (``rope_parameters.sliding_attention`` / ``rope_local_base_freq``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import AttentionShape
from engine.models.rope import Rotary, rotate
from memory import ForwardView


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class GemmaMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.ffn = ffn
        self.gate_up_proj = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.ffn, dim=-1)  # [T, ffn] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)  # [T, hidden]


class GemmaAttention(nn.Module):
    def __init__(self, shape: AttentionShape, layer: int, scale: float, softcap: float | None):
        super().__init__()
        self.s, self.layer, self.scale, self.softcap = shape, layer, scale, softcap
        self.q_size = shape.n_heads * shape.head_dim
        self.kv_size = shape.n_kv_heads * shape.head_dim
        self.qkv_proj = nn.Linear(shape.hidden, self.q_size + 2 * self.kv_size, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, shape.hidden, bias=shape.qkv_bias)
        if shape.qk_norm:
            self.q_norm = GemmaRMSNorm(shape.head_dim, shape.eps)
            self.k_norm = GemmaRMSNorm(shape.head_dim, shape.eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        s, n_tok = self.s, x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n_tok, s.n_heads, s.head_dim)  # [T, H, D]
        k = k.view(n_tok, s.n_kv_heads, s.head_dim)  # [T, KVH, D]
        v = v.view(n_tok, s.n_kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = view.attend(self.layer, q, k, v, scale=self.scale, softcap=self.softcap)  # [T, H, D]
        return self.o_proj(out.reshape(n_tok, self.q_size))  # [T, hidden]


class GemmaLayer(nn.Module):
    def __init__(self, shape: AttentionShape, ffn: int, layer: int, scale: float, softcap: float | None):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(shape.hidden, shape.eps)
        self.self_attn = GemmaAttention(shape, layer, scale, softcap)
        self.post_attention_layernorm = GemmaRMSNorm(shape.hidden, shape.eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(shape.hidden, shape.eps)
        self.mlp = GemmaMLP(shape.hidden, ffn)
        self.post_feedforward_layernorm = GemmaRMSNorm(shape.hidden, shape.eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, view))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))  # [T, hidden]


class GemmaLM(DecoderLM):
    qk_norm = False

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)  # builds the Llama skeleton; the Gemma parts replace it below
        raw = cfg.raw
        shape = AttentionShape(
            hidden=cfg.hidden_size,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            qkv_bias=cfg.attention_bias,
            qk_norm=self.qk_norm,
            eps=cfg.rms_norm_eps,
        )
        scale = float(raw.get("query_pre_attn_scalar") or cfg.head_dim) ** -0.5
        softcap = raw.get("attn_logit_softcapping")
        self.final_softcap = raw.get("final_logit_softcapping")
        self.model.layers = nn.ModuleList(
            GemmaLayer(shape, cfg.intermediate_size, i, scale, softcap) for i in range(cfg.n_layers)
        )
        self.model.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_scale = cfg.hidden_size**0.5
        self.rotary_local: Rotary | None = None
        if cfg.rope_local is not None:
            self.rotary_local = Rotary(cfg.rope_local, cfg.head_dim, cfg.max_position_embeddings)
        self.is_local = [t == "sliding_attention" for t in cfg.layer_types]

    def init_buffers(self, device: torch.device) -> None:
        super().init_buffers(device)
        cfg = self.cfg
        if cfg.rope_local is not None:
            self.rotary_local = Rotary(cfg.rope_local, cfg.head_dim, cfg.max_position_embeddings).to(device)

    def _rotary_of(self, layer: int) -> Rotary:
        return self.rotary_local if self.rotary_local is not None and self.is_local[layer] else self.rotary

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        cos, sin = self._rotary_of(layer).cos_sin(delta, scaled=False)
        return rotate(k.float(), cos, sin).to(k.dtype)

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor, media=None
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]. ``media``:
        (rows [M], image tokens [M, hidden]) that replace those rows' scaled embeddings."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        rope = {False: self.rotary.cos_sin(positions)}  # [T, 1, D] each
        if self.rotary_local is not None:
            rope[True] = self.rotary_local.cos_sin(positions)
        for i, layer in enumerate(self.model.layers):
            cos, sin = rope[self.is_local[i] and self.rotary_local is not None]
            x = layer(x, cos, sin, view)
        return self.model.norm(x[rows])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x).float()  # [S, vocab]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


class Gemma2ForCausalLM(GemmaLM):
    pass


class Gemma3ForCausalLM(GemmaLM):
    qk_norm = True
