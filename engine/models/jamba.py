"""AI21 Jamba (``JambaForCausalLM``): Mamba (version 1) mixers with attention every
``attn_layer_period`` layers (at ``attn_layer_offset``; no positional encoding), and a
sparse MoE instead of the MLP every ``expert_layer_period`` layers (at
``expert_layer_offset``). The config lists no layer types: they follow from the
periods and offsets.

The Mamba1 mixer: an input projection into (x, gate); a causal depthwise convolution
over x (window carried per sequence) and SiLU; from x, a low-rank dt and the B and C
vectors (each RMS-normed, Jamba's addition); a selective scan with a diagonal state per
channel (``A`` per channel and state); D skip; gated by SiLU(gate); output projection.
The router takes the top-k of the softmax over all experts, unnormalized; the experts
are stored one by one (``experts.<e>.{gate,up,down}_proj``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.models import rowwise
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import NoPositionAttention, RMSNorm, SeparateGatedMLP, embedding
from engine.models.moe import run_experts
from engine.models.ssm import conv_step, conv_window, mix, selective_scan, selective_step
from memory import ForwardView, FullAttentionSpec, LayerSpec
from memory.spec import RecurrentSpec


def _int(raw: dict, key: str, default: int | None = None) -> int:
    if raw.get(key) is None:
        if default is None:
            raise CheckpointError(f"config.json: required field '{key}' is missing")
        return default
    return int(raw[key])


class MambaMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.layer = layer
        self.inner = _int(raw, "mamba_expand", 2) * hidden
        self.n_state = _int(raw, "mamba_d_state")
        self.kernel = _int(raw, "mamba_d_conv", 4)
        rank = raw.get("mamba_dt_rank", "auto")
        self.rank = math.ceil(hidden / 16) if rank in (None, "auto") else int(rank)
        bias, eps = bool(raw.get("mamba_proj_bias", False)), cfg.rms_norm_eps
        self.in_proj = nn.Linear(hidden, 2 * self.inner, bias=bias)
        self.conv1d = nn.Conv1d(
            self.inner, self.inner, self.kernel, groups=self.inner, bias=raw.get("mamba_conv_bias", True)
        )
        self.x_proj = nn.Linear(self.inner, self.rank + 2 * self.n_state, bias=False)
        self.dt_proj = nn.Linear(self.rank, self.inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(self.inner, self.n_state))
        self.D = nn.Parameter(torch.zeros(self.inner))
        self.out_proj = nn.Linear(self.inner, hidden, bias=bias)
        self.dt_layernorm = RMSNorm(self.rank, eps)
        self.b_layernorm = RMSNorm(self.n_state, eps)
        self.c_layernorm = RMSNorm(self.n_state, eps)

    def spec(self, dtype: torch.dtype) -> RecurrentSpec:
        return RecurrentSpec((self.inner, self.kernel - 1), (self.inner, self.n_state), dtype)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        xs, gate = self.in_proj(x).split(self.inner, dim=-1)  # [T, d] each
        window, state = view.states(self.layer)  # [B, d, K - 1], [B, d, N]
        weight, bias = self.conv1d.weight[:, 0, :], self.conv1d.bias
        A = -torch.exp(self.A_log.float())  # [d, N]
        D = self.D.float()

        def step(xs, window, state):  # one token per sequence, batched
            conv, window = conv_step(xs, window, weight, bias)
            u = rowwise.silu(conv)
            dt, B, C = self._dt_b_c(u)
            y, state = selective_step(u, dt, A, B, C, D, state)
            return y, window, state

        def run(b: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # one sequence's chunk
            conv, new_window = conv_window(xs[rows], window[b], weight, bias)
            u = rowwise.silu(conv)
            dt, B, C = self._dt_b_c(u)
            y, new_state = selective_scan(u, dt, A, B, C, D, state[b])
            return y, new_window, new_state

        y, window, state = mix(view.batch, (xs,), window, state, step, run)
        view.store(self.layer, window, state)
        return self.out_proj((y * rowwise.silu(gate.float())).to(x.dtype))

    def _dt_b_c(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs [n, d] -> dt [n, d] (after softplus), B and C [n, N] (RMS-normed)."""
        ts, B, C = self.x_proj(u).split([self.rank, self.n_state, self.n_state], dim=-1)
        dt = rowwise.softplus(self.dt_proj(self.dt_layernorm(ts)).float())
        return dt, self.b_layernorm(B), self.c_layernorm(C)


class JambaMoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.router = rowwise.Linear(hidden, n_experts, bias=False)
        self.experts = nn.ModuleList(SeparateGatedMLP(hidden, ffn) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]; each token's top-k experts weighted by their
        share of the softmax over all experts (not renormalized)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)  # [T, E]
        weights, idx = probs.topk(self.top_k, dim=-1)  # [T, k]
        return run_experts(x, self.experts, weights.to(x.dtype), idx)


class JambaLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, attention: bool, n_experts: int):
        super().__init__()
        raw = cfg.raw
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if attention:
            self.self_attn = NoPositionAttention(cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, layer)
        else:
            self.mamba = MambaMixer(cfg, layer)
        if n_experts > 1:
            top_k = _int(raw, "num_experts_per_tok", 2)
            self.feed_forward = JambaMoE(cfg.hidden_size, cfg.intermediate_size, n_experts, top_k)
        else:
            self.feed_forward = SeparateGatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.mamba(h, view) if hasattr(self, "mamba") else self.self_attn(h, view))
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class JambaForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw = cfg.raw
        a_period, a_offset = _int(raw, "attn_layer_period", 8), _int(raw, "attn_layer_offset", 4)
        e_period, e_offset = _int(raw, "expert_layer_period", 2), _int(raw, "expert_layer_offset", 1)
        n_experts = _int(raw, "num_experts", _int(raw, "num_local_experts", 1))
        self.is_attention = [i % a_period == a_offset for i in range(cfg.n_layers)]
        experts = [n_experts if i % e_period == e_offset else 1 for i in range(cfg.n_layers)]
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(
            JambaLayer(cfg, i, self.is_attention[i], experts[i]) for i in range(cfg.n_layers)
        )
        self.model.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names

    def init_buffers(self, device: torch.device) -> None:
        return None  # nothing computed

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        return [
            FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype) if attn else layer.mamba.spec(dtype)
            for attn, layer in zip(self.is_attention, self.model.layers)
        ]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return k  # keys carry no position

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        for layer in self.model.layers:
            x = layer(x, view)
        return self.model.final_layernorm(x[rows])
