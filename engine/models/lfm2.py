"""Liquid's LFM2 (``Lfm2ForCausalLM``): most layers a gated short convolution, some GQA
attention with per-head q/k RMSNorm, each followed by a SwiGLU MLP (issue 52).

The short convolution: one input projection into (B, C, x); B * x through a causal
depthwise convolution of ``conv_L_cache`` taps (its last ``L - 1`` inputs carried per
sequence); C times that; the output projection. Its memory is a ``RecurrentSpec`` whose
state is that window alone (the SSM part is one unused number per sequence), so the
conv layers get everything the recurrent memory has: checkpoints, rollback, ``seq_cp``,
slot files, the prompt cache. The final norm is ``model.embedding_norm`` (the
checkpoint's name); the LM head is tied to the embeddings. LFM2-MoE
(``Lfm2MoeForCausalLM``) is the same model with experts after the first
``num_dense_layers`` layers.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.models import rowwise
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, embedding
from engine.models.moe import run_experts
from engine.models.rope import Rotary, rotate
from engine.models.ssm import conv_step, conv_window, mix
from memory import ForwardView, FullAttentionSpec, LayerSpec
from memory.spec import RecurrentSpec

STATE = (1,)  # the recurrent memory's second state, unused by a short convolution


class ShortConv(nn.Module):
    def __init__(self, hidden: int, kernel: int, bias: bool, layer: int):
        super().__init__()
        self.layer, self.hidden = layer, hidden
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.conv = nn.Conv1d(hidden, hidden, kernel, groups=hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        """x: [T, hidden] (the batch's sequences, each a run of rows) -> [T, hidden]."""
        b, c, xs = self.in_proj(x).chunk(3, dim=-1)  # [T, hidden] each
        bx = b * xs
        window, state = view.states(self.layer)  # [B, hidden, L - 1], [B, 1]
        weight, bias = self.conv.weight[:, 0, :], self.conv.bias  # [hidden, L]

        def step(bx, window, state):  # one token per sequence, batched
            conv, window = conv_step(bx, window, weight, bias)
            return conv, window, state

        def run(i: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # one sequence's chunk
            out, new_window = conv_window(bx[rows], window[i], weight, bias)
            return out, new_window, state[i]

        conv, window, state = mix(view.batch, (bx,), window, state, step, run)
        view.store(self.layer, window, state)
        return self.out_proj(c * conv.to(x.dtype))


class Lfm2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=False)
        self.out_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=False)
        self.q_layernorm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_layernorm = RMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_layernorm(self.q_proj(x).view(n * self.n_heads, self.d)).view(n, self.n_heads, self.d)
        k = self.k_layernorm(self.k_proj(x).view(n * self.n_kv, self.d)).view(n, self.n_kv, self.d)
        v = self.v_proj(x).view(n, self.n_kv, self.d)  # [T, KVH, D]
        q, k = rotate(q, *rope), rotate(k, *rope)
        out = view.attend(self.layer, q, k, v, scale=self.d**-0.5)  # [T, H, D]
        return self.out_proj(out.reshape(n, self.n_heads * self.d))


class Lfm2MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(rowwise.silu(self.w1(x)) * self.w3(x))


def ffn_size(raw: dict, size: int) -> int:
    """LFM2's ``block_auto_adjust_ff_dim``: two thirds of the size, times the multiplier,
    rounded up to ``block_multiple_of`` (transformers' rule)."""
    if not raw.get("block_auto_adjust_ff_dim"):
        return size
    size = int(2 * size / 3)
    if raw.get("block_ffn_dim_multiplier") is not None:
        size = int(float(raw["block_ffn_dim_multiplier"]) * size)
        multiple = int(raw.get("block_multiple_of") or 256)
        size = multiple * ((size + multiple - 1) // multiple)
    return size


class Lfm2MoE(nn.Module):
    """LFM2-MoE's experts: sigmoid scores; the top-k chosen on score + ``expert_bias``
    (a load-balancing offset that only steers the choice), weighted by their scores,
    renormalized when ``norm_topk_prob``, times ``routed_scaling_factor``."""

    def __init__(self, raw: dict, hidden: int):
        super().__init__()
        n = int(raw["num_experts"])
        self.top_k, self.norm = int(raw["num_experts_per_tok"]), bool(raw.get("norm_topk_prob", True))
        self.scale = float(raw.get("routed_scaling_factor") or 1.0)
        self.gate = rowwise.Linear(hidden, n, bias=False)
        self.experts = nn.ModuleList(Lfm2MLP(hidden, int(raw["moe_intermediate_size"])) for _ in range(n))
        self.expert_bias = nn.Parameter(torch.zeros(n)) if raw.get("use_expert_bias", True) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        scores = rowwise.sigmoid(self.gate(x).float())  # [T, E]
        steer = scores if self.expert_bias is None else scores + self.expert_bias.float()
        idx = steer.topk(self.top_k, dim=-1).indices  # [T, k]
        weights = scores.gather(1, idx)
        if self.norm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-6)
        return run_experts(x, self.experts, (weights * self.scale).to(x.dtype), idx)


class Lfm2Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        hidden, raw = cfg.hidden_size, cfg.raw
        if cfg.layer_types[layer] == "recurrent":
            kernel = int(raw.get("conv_L_cache") or 3)
            self.conv = ShortConv(hidden, kernel, bool(raw.get("conv_bias", False)), layer)
        else:
            self.self_attn = Lfm2Attention(cfg, layer)
        if raw.get("num_experts") and layer >= int(raw.get("num_dense_layers") or 0):  # LFM2-MoE
            self.feed_forward = Lfm2MoE(raw, hidden)
        else:
            self.feed_forward = Lfm2MLP(hidden, ffn_size(raw, cfg.intermediate_size))
        self.operator_norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(hidden, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView) -> torch.Tensor:
        h = self.operator_norm(x)
        x = x + (self.conv(h, view) if hasattr(self, "conv") else self.self_attn(h, rope, view))
        return x + self.feed_forward(self.ffn_norm(x))


class Lfm2ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        if not cfg.layer_types or set(cfg.layer_types) - {"recurrent", "full_attention"}:
            raise CheckpointError("config.json: LFM2 layers must be 'conv' or 'full_attention'")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(Lfm2Layer(cfg, i) for i in range(cfg.n_layers))
        self.model.embedding_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        kernel = int(cfg.raw.get("conv_L_cache") or 3)
        return [
            RecurrentSpec((cfg.hidden_size, kernel - 1), STATE, dtype)
            if kind == "recurrent"
            else FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype)
            for kind in cfg.layer_types
        ]

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor, media=None
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.cos_sin(positions)  # [T, 1, D] each
        for layer in self.model.layers:
            x = layer(x, rope, view)
        return self.model.embedding_norm(x[rows])  # [S, hidden]


class Lfm2MoeForCausalLM(Lfm2ForCausalLM):
    pass
