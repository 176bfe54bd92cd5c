"""Qwen3.5 text (``Qwen3_5ForCausalLM``, issue 52): Gated DeltaNet layers with gated full
attention every few layers (3:1 in the released models), each followed by a SwiGLU MLP.

Gated DeltaNet (the gated delta rule: engine/models/delta_rule.py), with
g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); q, k, v come through a
causal depthwise convolution (SiLU) whose last ``K - 1`` inputs are carried; y goes
through an RMSNorm gated by SiLU(z). With more value heads than key heads, the value
heads of one key head are grouped (the checkpoints' order) or, from a GGUF, tiled
(llama.cpp's order: value head h reads key head h % Hk), so the file's quantized
matrices are used as written. Its memory is a ``RecurrentSpec``: the conv window
[conv_dim, K - 1] and the state [Hv, Dk, Dv] per sequence, so checkpoints, rollback,
``seq_cp``, slot files and the prompt cache apply unchanged. The attention's query
projection also gives a sigmoid gate on its output; q/k norms and the layer norms are
zero-centred (weight + 1); rotary on the first ``partial_rotary_factor`` of each head.
Prefill runs the recurrence in chunks, decode one batched step.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models import rowwise
from engine.models.base import FUSED, DecoderLM
from engine.models.config import ModelConfig
from engine.models.delta_rule import delta_chunked, delta_step
from engine.models.gemma import GemmaRMSNorm
from engine.models.layers import GatedMLP, embedding
from engine.models.rope import Rotary, rotate
from engine.models.ssm import conv_step, conv_window, mix
from memory import ForwardView, FullAttentionSpec, LayerSpec
from memory.spec import RecurrentSpec

TILED = "slotserve_value_heads_tiled"  # config key a GGUF's config sets: its value heads stay as written


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (h * rowwise.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        raw = cfg.raw
        self.layer = layer
        self.hv, self.hk = int(raw["linear_num_value_heads"]), int(raw["linear_num_key_heads"])
        self.dk, self.dv = int(raw["linear_key_head_dim"]), int(raw["linear_value_head_dim"])
        self.kernel = int(raw.get("linear_conv_kernel_dim") or 4)
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.tiled = bool(raw.get(TILED))  # value heads in llama.cpp's tiled order (a GGUF's)
        conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, self.kernel, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)

    def spec(self, dtype: torch.dtype) -> RecurrentSpec:
        return RecurrentSpec((2 * self.key_dim + self.value_dim, self.kernel - 1), (self.hv, self.dk, self.dv), dtype)

    def _heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs [n, conv_dim] -> q, k [n, Hv, Dk] (normed, q scaled), v [n, Hv, Dv]."""
        q, k, v = mixed.float().split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.hv // self.hk
        q, k = _l2(q.view(-1, self.hk, self.dk)), _l2(k.view(-1, self.hk, self.dk))
        if self.tiled:  # value head h reads key head h % Hk (llama.cpp's order)
            q, k = q.repeat(1, rep, 1), k.repeat(1, rep, 1)
        else:  # value head h reads key head h // (Hv / Hk) (the checkpoints' order)
            q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
        return q / self.dk**0.5, k, v.view(-1, self.hv, self.dv)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        """x: [T, hidden] (the batch's sequences, each a run of rows) -> [T, hidden]."""
        mixed = self.in_proj_qkv(x)  # [T, conv_dim]: q, k of every key head, then v grouped by key head
        z = self.in_proj_z(x).view(-1, self.hv, self.dv)
        beta = rowwise.sigmoid(self.in_proj_b(x).float())  # [T, Hv]
        g = -self.A_log.float().exp() * rowwise.softplus(self.in_proj_a(x).float() + self.dt_bias.float())  # [T, Hv]
        window, state = view.states(self.layer)  # [B, C, K - 1], [B, Hv, Dk, Dv]
        weight = self.conv1d.weight[:, 0, :]  # [C, K]

        def step(mixed, g, beta, window, state):  # one token per sequence, batched
            conv, window = conv_step(mixed, window, weight, None)
            y, state = delta_step(*self._heads(rowwise.silu(conv)), g, beta, state.float())
            return y, window, state

        def run(b: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # one sequence's chunk
            conv, new_window = conv_window(mixed[rows], window[b], weight, None)
            y, new_state = delta_chunked(*self._heads(rowwise.silu(conv)), g[rows], beta[rows], state[b].float())
            return y, new_window, new_state

        y, window, state = mix(view.batch, (mixed, g, beta), window, state, step, run)
        view.store(self.layer, window, state)
        y = self.norm(y.to(x.dtype), z)  # [T, Hv, Dv]
        return self.out_proj(y.reshape(-1, self.value_dim))


def _l2(x: torch.Tensor) -> torch.Tensor:
    """transformers' (and FLA's) l2norm: x / sqrt(sum(x^2) + 1e-6)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary_dim: int):
        super().__init__()
        self.layer, self.rot = layer, rotary_dim
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d * 2, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=bias)
        self.q_norm = GemmaRMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.d, cfg.rms_norm_eps)

    def _rope(self, x: torch.Tensor, rope: tuple) -> torch.Tensor:
        return torch.cat([rotate(x[..., : self.rot].contiguous(), *rope), x[..., self.rot :]], dim=-1)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView) -> torch.Tensor:
        n = x.shape[0]
        q, gate = self.q_proj(x).view(n, self.n_heads, 2 * self.d).chunk(2, dim=-1)  # [T, H, D] each
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(n, self.n_kv, self.d))
        v = self.v_proj(x).view(n, self.n_kv, self.d)
        out = view.attend(self.layer, self._rope(q, rope), self._rope(k, rope), v, scale=self.d**-0.5)  # [T, H, D]
        out = out.reshape(n, self.n_heads * self.d) * rowwise.sigmoid(gate.reshape(n, -1))
        return self.o_proj(out)


class Qwen3_5Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary_dim: int, mlp: nn.Module):
        super().__init__()
        if cfg.layer_types[layer] == "recurrent":
            self.linear_attn = GatedDeltaNet(cfg, layer)
        else:
            self.self_attn = GatedAttention(cfg, layer, rotary_dim)
        self.mlp = mlp
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, view) if hasattr(self, "linear_attn") else self.self_attn(h, rope, view))
        return x + self.mlp(self.post_attention_layernorm(x))


def rotary_dim(cfg: ModelConfig) -> int:
    """The rotated part of each head: ``partial_rotary_factor`` (in ``rope_parameters``
    in transformers 5, top level before) of the head, an even number."""
    params = cfg.raw.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", cfg.raw.get("partial_rotary_factor", 1.0))
    return int(cfg.head_dim * float(factor)) // 2 * 2


def mrope_sections(raw: dict) -> list[int]:
    """Interleaved M-RoPE's (time, height, width) sections: ``mrope_section`` in
    ``rope_parameters`` (``rope_scaling`` in transformers 4), Qwen3.5's [11, 11, 10]
    where the config is silent."""
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("mrope_section"):
            return [int(s) for s in params["mrope_section"]]
    return [11, 11, 10]


class Qwen3_5ForCausalLM(DecoderLM):
    skipped_prefixes = ("mtp.",)  # the multi-token-prediction head published with the model

    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.rot = rotary_dim(cfg)
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(Qwen3_5Layer(cfg, i, self.rot, self.mlp(i)) for i in range(cfg.n_layers))
        self.model.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int | None]] = {"gate_up_proj": [None, None]}  # gate and up fused, halves
        self.rotary = Rotary(cfg.rope, self.rot, cfg.max_position_embeddings)

    def mlp(self, layer: int) -> nn.Module:
        """The feed-forward block of ``layer`` (dense here; experts in the MoE variants)."""
        return GatedMLP(self.cfg.hidden_size, self.cfg.intermediate_size)

    def init_buffers(self, device: torch.device) -> None:
        self.rotary = Rotary(self.cfg.rope, self.rot, self.cfg.max_position_embeddings).to(device)

    def _target(self, name: str) -> tuple[str, int | None]:
        """gate_proj and up_proj load as the two halves of one gate_up_proj (one matmul and
        the fused activation, dense MLP and experts alike); the rest under its own name."""
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in ("gate_proj", "up_proj"):
            fused, shard = FUSED[parts[-2]]
            return ".".join(parts[:-2] + [fused, parts[-1]]), shard
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        return [
            layer.linear_attn.spec(dtype)
            if hasattr(layer, "linear_attn")
            else FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype)
            for layer in self.model.layers
        ]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(delta, scaled=False)
        head = rotate(k[..., : self.rot].float().contiguous(), cos, sin).to(k.dtype)
        return torch.cat([head, k[..., self.rot :]], dim=-1)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        view: ForwardView,
        rows: torch.Tensor,
        media=None,
        rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden].
        ``media``: (rows [M], image tokens [M, hidden]) put in place of those rows'
        embeddings; ``rope_positions`` [3, T]: the rotation's interleaved M-RoPE
        positions (a sequence with images: qwen3_5_vl.py), else ``positions``."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        if rope_positions is None:
            rope = self.rotary.cos_sin(positions)  # [T, 1, rot] each
        else:
            rope = self.rotary.cos_sin_interleaved(rope_positions, mrope_sections(self.cfg.raw))  # [T, 1, rot] each
        for layer in self.model.layers:
            x = layer(x, rope, view)
        return self.model.norm(x[rows])  # [S, hidden]
