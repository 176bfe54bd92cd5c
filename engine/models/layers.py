"""Shared building blocks of the Llama family: RMSNorm, gated MLP, attention through
memory, decoder layer. Tokens of all sequences are one flat batch: [T, hidden]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.activation import fused_silu_mul
from engine.kernels.norm import fused_rms_norm
from engine.kernels.packed_layer import run_packed_layer
from engine.models import rowwise
from engine.models.rope import rotate
from memory import ForwardView


@dataclass(frozen=True)
class AttentionShape:
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    eps: float = 1e-6
    rotary_dim: int = 0  # the rotated first part of each head (Phi-4-mini, GLM-4 MoE); 0: the whole head


def embedding(n_rows: int, dim: int) -> nn.Embedding:
    """An embedding table [n_rows, dim] without its random init: every model here is
    built on the meta device and then loaded, and torch's meta ``normal_`` imports
    torch._dynamo (1.3-1.7 s of every process that loads a model, measured)."""
    return nn.Embedding(n_rows, dim, _weight=torch.empty(n_rows, dim))


FUSED_NORM_ROWS = 64  # F.rms_norm wins below (fewer dispatches), loses ~10x at 512 rows on CPU


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_rms_norm(x, self.weight, self.eps)  # one compiled call, where built
        if fused is not None:
            return fused
        if x.dtype == torch.float32 and x.shape[0] <= FUSED_NORM_ROWS:  # one op; same math as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SeparateGatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate, up and down under their checkpoint names
    (the models whose loaders fuse nothing: Jamba, the Qwen3.5 family, Gemma 4 with
    GELU-tanh); ``act`` SiLU by default."""

    def __init__(self, hidden: int, ffn: int, act=rowwise.silu):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class NoPositionAttention(nn.Module):
    """Attention without positional encoding (Jamba's, Nemotron-H's): q, k, v and o
    projections under their checkpoint names, scores scaled by 1/sqrt(head_dim)."""

    def __init__(self, hidden: int, n_heads: int, n_kv: int, head_dim: int, layer: int, bias: bool = False):
        super().__init__()
        self.layer, self.n_heads, self.n_kv, self.d = layer, n_heads, n_kv, head_dim
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.n_heads, self.d)
        k = self.k_proj(x).view(n, self.n_kv, self.d)
        v = self.v_proj(x).view(n, self.n_kv, self.d)
        return self.o_proj(view.attend(self.layer, q, k, v, scale=self.d**-0.5).reshape(n, -1))


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    fused_act = (0, 1.0, 0.0)  # as an expert: engine/kernels/moe_kernel.py's silu(gate) * up

    def __init__(self, hidden: int, ffn: int, bias: bool = False):
        super().__init__()
        self.ffn = ffn
        self.gate_up_proj = nn.Linear(hidden, 2 * ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * ffn]
        hidden = fused_silu_mul(gate_up)  # one compiled call, where built
        if hidden is None:
            gate, up = gate_up.split(self.ffn, dim=-1)  # [T, ffn] each
            hidden = rowwise.silu(gate) * up
        return self.down_proj(hidden)  # [T, hidden]


class Attention(nn.Module):
    def __init__(self, shape: AttentionShape, layer: int):
        super().__init__()
        self.s = shape
        self.layer = layer
        self.q_size = shape.n_heads * shape.head_dim
        self.kv_size = shape.n_kv_heads * shape.head_dim
        self.qkv_proj = nn.Linear(shape.hidden, self.q_size + 2 * self.kv_size, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, shape.hidden, bias=shape.o_bias)
        if shape.qk_norm:
            self.q_norm = RMSNorm(shape.head_dim, shape.eps)
            self.k_norm = RMSNorm(shape.head_dim, shape.eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        s, n_tok = self.s, x.shape[0]
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(n_tok, s.n_heads + s.n_kv_heads, s.head_dim)  # [T, H + KVH, D]
        v = v.view(n_tok, s.n_kv_heads, s.head_dim)  # [T, KVH, D]
        if s.qk_norm:
            q, k = qk.split([s.n_heads, s.n_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        if s.rotary_dim and s.rotary_dim < s.head_dim:  # rotate-half over the first rotary_dim of each head
            turned = rotate(qk[..., : s.rotary_dim].contiguous(), cos, sin)  # [T, H + KVH, R]
            qk = torch.cat([turned, qk[..., s.rotary_dim :]], dim=-1)
        else:
            qk = rotate(qk, cos, sin)
        q, k = qk.split([s.n_heads, s.n_kv_heads], dim=1)  # one rotation for q and k
        out = self.attend(view, q, k, v)  # [T, H, D]
        return self.o_proj(out.reshape(n_tok, self.q_size))  # [T, hidden]

    def attend(self, view: ForwardView, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k, v [T, KVH, D] (rotated) -> [T, H, D] through the memory."""
        return view.attend(self.layer, q, k, v)


class DecoderLayer(nn.Module):
    def __init__(self, shape: AttentionShape, ffn: int, mlp_bias: bool, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.self_attn = Attention(shape, layer)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.mlp = GatedMLP(shape.hidden, ffn, mlp_bias)
        self._shape: int | None = None  # _structure(), once the model has set its modules

    def _structure(self) -> int:
        """What the compiled layer (engine/kernels/packed_layer.py) may reproduce: 0
        nothing (a norm or an attention forward of another kind), 1 the attention half
        with any MLP after it (a mixture of experts), 2 the whole layer (a GatedMLP)."""
        norms = (self.input_layernorm, self.post_attention_layernorm)
        if not all(type(n) is RMSNorm for n in norms) or type(self.self_attn).forward is not Attention.forward:
            return 0
        return 2 if type(self.mlp) is GatedMLP else 1

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        if self._shape is None:
            self._shape = self._structure()
        if self._shape:  # packed projections: compiled calls around attention
            fused = run_packed_layer(self, x, cos, sin, view, dense=self._shape == 2)
            if fused is not None:
                return fused
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, view)
        return x + self.mlp(self.post_attention_layernorm(x))  # [T, hidden]
