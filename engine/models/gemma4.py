"""Gemma 4 text (``Gemma4ForCausalLM``, issue 52), and the published multimodal folders
(``Gemma4ForConditionalGeneration``) served as text.

Sliding and full attention layers, each type with its own head size, KV head count and
rotary: the full layers' heads are ``global_head_dim`` wide (``per_layer_config`` in
transformers 5's configs) with "proportional" rotary (the first quarter of the angles
turn), and with ``attention_k_eq_v`` their values are the key projection's output. q, k
and v are RMS-normed (v without a scale); scores are not scaled. The last
``num_kv_shared_layers`` layers reuse the cache of the last earlier layer of their type
(``ReuseSpec``, the memory Gemma 3n's KV sharing built), with a double-wide MLP when
``use_double_wide_mlp``. Per-layer inputs (E2B/E4B) as in Gemma 3n. With
``enable_moe_block`` each layer adds experts beside its MLP: the router reads the
layer's input (RMS-normed, scaled), softmax, top-k renormalized, times a per-expert
scale; each output through its own norm, summed. Every layer's output is multiplied
by its ``layer_scalar``; logits are soft-capped.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.models import rowwise
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.gemma3n import Norm, sharing_targets
from engine.models.layers import SeparateGatedMLP, embedding
from engine.models.moe import run_stacked_experts
from engine.models.rope import Rotary, rotate
from memory import ForwardView, FullAttentionSpec, LayerSpec, ReuseSpec, SlidingWindowSpec


def layer_shape(cfg: ModelConfig, layer: int) -> tuple[int, int]:
    """(head size, KV heads) of ``layer``: the config's, or a full layer's own."""
    raw = cfg.raw
    own = (raw.get("per_layer_config") or {}).get(str(layer)) or {}
    if cfg.layer_types[layer] != "full_attention":
        return int(own.get("head_dim") or cfg.head_dim), int(own.get("num_key_value_heads") or cfg.n_kv_heads)
    head = own.get("head_dim") or raw.get("global_head_dim") or cfg.head_dim
    shared_kv = raw.get("num_global_key_value_heads") if raw.get("attention_k_eq_v") else None
    return int(head), int(own.get("num_key_value_heads") or shared_kv or cfg.n_kv_heads)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shared: bool):
        super().__init__()
        self.layer, self.shared = layer, shared
        self.d, self.n_kv = layer_shape(cfg, layer)
        self.n_heads = cfg.n_heads
        self.k_is_v = bool(cfg.raw.get("attention_k_eq_v")) and cfg.layer_types[layer] == "full_attention"
        bias, eps = cfg.attention_bias, cfg.rms_norm_eps
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=bias)
        self.q_norm = Norm(self.d, eps)
        if not shared:  # layers that reuse another's cache have no key/value weights
            self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
            if not self.k_is_v:
                self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
            self.k_norm = Norm(self.d, eps)
            self.v_norm = Norm(self.d, eps, with_scale=False)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView) -> torch.Tensor:
        n = x.shape[0]
        q = rotate(self.q_norm(self.q_proj(x).view(n, self.n_heads, self.d)), *rope)  # [T, H, D]
        k = v = None
        if not self.shared:
            raw_k = self.k_proj(x).view(n, self.n_kv, self.d)
            k = rotate(self.k_norm(raw_k), *rope)  # [T, KVH, D]
            v = self.v_norm(raw_k if self.k_is_v else self.v_proj(x).view(n, self.n_kv, self.d))
        out = view.attend(self.layer, q, k, v, scale=1.0)  # [T, H, D]
        return self.o_proj(out.reshape(n, self.n_heads * self.d))


class Router(nn.Module):
    def __init__(self, hidden: int, n_experts: int, top_k: int, eps: float):
        super().__init__()
        self.top_k = top_k
        self.norm = Norm(hidden, eps, with_scale=False)
        self.proj = rowwise.Linear(hidden, n_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] float32, expert ids [T, k])."""
        h = self.norm(x) * self.scale * x.shape[-1] ** -0.5
        probs = torch.softmax(self.proj(h).float(), dim=-1)  # [T, E]
        weights, idx = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return weights * self.per_expert_scale.float()[idx], idx


class Experts(nn.Module):
    """Stacked as in the checkpoints: ``gate_up_proj`` [E, 2F, hidden], ``down_proj`` [E, hidden, F]."""

    def __init__(self, hidden: int, ffn: int, n_experts: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(n_experts, 2 * ffn, hidden))
        self.down_proj = nn.Parameter(torch.zeros(n_experts, hidden, ffn))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden]; weights, idx: [T, k] -> [T, hidden], grouped by expert."""
        return run_stacked_experts(x, self.gate_up_proj, self.down_proj, weights, idx, rowwise.gelu_tanh)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shared: bool, per_layer: int):
        super().__init__()
        raw, hidden, eps = cfg.raw, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer, shared)
        wide = 2 if raw.get("use_double_wide_mlp") and shared else 1
        self.mlp = SeparateGatedMLP(hidden, cfg.intermediate_size * wide, rowwise.gelu_tanh)
        self.input_layernorm = Norm(hidden, eps)
        self.post_attention_layernorm = Norm(hidden, eps)
        self.pre_feedforward_layernorm = Norm(hidden, eps)
        self.post_feedforward_layernorm = Norm(hidden, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        if per_layer:
            self.per_layer_input_gate = rowwise.Linear(hidden, per_layer, bias=False)
            self.per_layer_projection = rowwise.Linear(per_layer, hidden, bias=False)
            self.post_per_layer_input_norm = Norm(hidden, eps)
        if raw.get("enable_moe_block"):
            n_experts = int(raw["num_experts"])
            self.router = Router(hidden, n_experts, int(raw["top_k_experts"]), eps)
            self.experts = Experts(hidden, int(raw["moe_intermediate_size"]), n_experts)
            self.post_feedforward_layernorm_1 = Norm(hidden, eps)
            self.post_feedforward_layernorm_2 = Norm(hidden, eps)
            self.pre_feedforward_layernorm_2 = Norm(hidden, eps)

    def forward(self, x: torch.Tensor, rope: tuple, view: ForwardView, per_layer: torch.Tensor | None) -> torch.Tensor:
        """x: [T, hidden]; per_layer: [T, per_layer_hidden] or None -> [T, hidden]."""
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, view))
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if hasattr(self, "experts"):
            weights, idx = self.router(x)
            routed = self.experts(self.pre_feedforward_layernorm_2(x), weights, idx)
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(routed)
        x = x + self.post_feedforward_layernorm(h)
        if per_layer is not None:
            h = rowwise.gelu_tanh(self.per_layer_input_gate(x)) * per_layer
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(h))
        return x * self.layer_scalar


class Gemma4ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw, n_layers, hidden = cfg.raw, cfg.n_layers, cfg.hidden_size
        if raw.get("use_bidirectional_attention") == "all":
            raise CheckpointError(
                "config.json: field 'use_bidirectional_attention' is 'all'; slotserve serves causal models"
            )
        self.targets = sharing_targets(cfg.layer_types, int(raw.get("num_kv_shared_layers") or 0))
        self.per_layer_hidden = int(raw.get("hidden_size_per_layer_input") or 0)
        self.vocab_per_layer = int(raw.get("vocab_size_per_layer_input") or cfg.vocab_size)
        self.final_softcap = raw.get("final_logit_softcapping")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, hidden)
        if self.per_layer_hidden:
            self.model.embed_tokens_per_layer = embedding(self.vocab_per_layer, n_layers * self.per_layer_hidden)
            self.model.per_layer_model_projection = nn.Linear(hidden, n_layers * self.per_layer_hidden, bias=False)
            self.model.per_layer_projection_norm = Norm(self.per_layer_hidden, cfg.rms_norm_eps)
        self.model.layers = nn.ModuleList(
            Layer(cfg, i, i in self.targets, self.per_layer_hidden) for i in range(n_layers)
        )
        self.model.norm = Norm(hidden, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names
        self.is_local = [t == "sliding_attention" for t in cfg.layer_types]
        self.init_buffers(torch.device("cpu"))

    def init_buffers(self, device: torch.device) -> None:
        cfg = self.cfg
        full = next((i for i, local in enumerate(self.is_local) if not local), 0)
        local = next((i for i, loc in enumerate(self.is_local) if loc), 0)
        max_pos = cfg.max_position_embeddings
        self.rotary = Rotary(cfg.rope, layer_shape(cfg, full)[0], max_pos).to(device)
        self.rotary_local = Rotary(cfg.rope_local or cfg.rope, layer_shape(cfg, local)[0], max_pos).to(device)

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def load_weights(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        """As the base class, minus the key/value weights that checkpoints may still carry
        for the layers that share another layer's cache."""
        shared = tuple(f"model.layers.{i}.self_attn.{w}" for i in self.targets for w in ("k_", "v_"))
        super().load_weights((f, n, t) for f, n, t in tensors if not n.startswith(shared))

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        specs: list[LayerSpec] = []
        for i, kind in enumerate(cfg.layer_types):
            head, n_kv = layer_shape(cfg, i)
            if i in self.targets:
                specs.append(ReuseSpec(self.targets[i]))
            elif kind == "sliding_attention":
                specs.append(SlidingWindowSpec(n_kv, head, dtype, cfg.sliding_window))
            else:
                specs.append(FullAttentionSpec(n_kv, head, dtype))
        return specs

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        rotary = self.rotary_local if self.is_local[layer] else self.rotary
        cos, sin = rotary.cos_sin(delta, scaled=False)
        return rotate(k.float(), cos, sin).to(k.dtype)

    def _per_layer_inputs(self, input_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """input_ids: [T], x: the scaled embeddings [T, hidden] -> [T, L, per_layer_hidden]."""
        m, n_layers, hpl = self.model, self.cfg.n_layers, self.per_layer_hidden
        ids = torch.where((input_ids >= 0) & (input_ids < self.vocab_per_layer), input_ids, 0)
        own = m.embed_tokens_per_layer(ids)  # [T, L * hpl]
        own = (own * torch.tensor(hpl**0.5, dtype=own.dtype)).reshape(-1, n_layers, hpl)
        proj = m.per_layer_model_projection(x) * torch.tensor(self.cfg.hidden_size**-0.5, dtype=x.dtype)
        proj = m.per_layer_projection_norm(proj.reshape(-1, n_layers, hpl))
        return (proj + own) * torch.tensor(2.0**-0.5, dtype=x.dtype)

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        x = x * torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype)
        per_layer = self._per_layer_inputs(input_ids, x) if self.per_layer_hidden else None
        rope = {False: self.rotary.cos_sin(positions), True: self.rotary_local.cos_sin(positions)}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope[self.is_local[i]], view, per_layer[:, i] if per_layer is not None else None)
        return self.model.norm(x[rows])  # [S, hidden]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x).float()  # [S, vocab]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """A published Gemma 4 folder (vision and audio towers included), served as text."""

    checkpoint_prefixes = (("model.language_model.", "model."),)
    skipped_prefixes = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
