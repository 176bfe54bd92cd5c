"""Gemma 3n (text): Gemma 3's attention pattern with AltUp, Laurel, per-layer inputs,
activation sparsity and KV sharing. Shapes follow transformers' Gemma3nTextModel with
the batch and sequence dimensions flattened into one token dimension T.

- AltUp keeps ``altup_num_inputs`` (A) copies of the hidden state, [A, T, hidden]; each
  layer predicts all of them from a learned mix, runs on the active one, then corrects
  the others with the layer's innovation.
- Laurel: a low-rank residual branch beside attention.
- Per-layer inputs: a second embedding table gives every token a small vector per
  layer, mixed with a projection of the main embedding, gated into each layer's output.
- Activation sparsity: in the first layers the MLP's gate keeps only values above
  mean + std * Phi^-1(sparsity) (a Gaussian top-k).
- KV sharing: the last ``num_kv_shared_layers`` layers compute queries only and attend
  to the cache of the last earlier layer of their type (``ReuseSpec``: they store
  nothing).
- RMSNorms scale by ``weight`` (not 1 + weight); values are RMS-normalized without a
  scale; scores are not scaled (scale 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import NormalDist

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import embedding
from engine.models.rope import Rotary, rotate
from memory import ForwardView, FullAttentionSpec, LayerSpec, ReuseSpec, SlidingWindowSpec


class Norm(nn.Module):
    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        if with_scale:
            self.weight = nn.Parameter(torch.ones(dim))
        self.with_scale = with_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.with_scale:
            h = h * self.weight.float()
        return h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shared: bool):
        super().__init__()
        self.layer, self.shared = layer, shared
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=bias)
        self.q_norm = Norm(self.d, cfg.rms_norm_eps)
        if not shared:  # layers that reuse another's cache have no key/value weights
            self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
            self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=bias)
            self.k_norm = Norm(self.d, cfg.rms_norm_eps)
            self.v_norm = Norm(self.d, cfg.rms_norm_eps, with_scale=False)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView) -> torch.Tensor:
        n_tok = x.shape[0]
        q = rotate(self.q_norm(self.q_proj(x).view(n_tok, self.n_heads, self.d)), cos, sin)  # [T, H, D]
        k = v = None
        if not self.shared:
            k = rotate(self.k_norm(self.k_proj(x).view(n_tok, self.n_kv, self.d)), cos, sin)  # [T, KVH, D]
            v = self.v_norm(self.v_proj(x).view(n_tok, self.n_kv, self.d))
        out = view.attend(self.layer, q, k, v, scale=1.0)  # [T, H, D]
        return self.o_proj(out.reshape(n_tok, self.n_heads * self.d))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, sparsity: float):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)
        self.std_multiplier = NormalDist().inv_cdf(sparsity) if sparsity > 0 else None  # Phi^-1(sparsity)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)  # [T, ffn]
        if self.std_multiplier is not None:  # Gaussian top-k: keep what lies above the cutoff
            cutoff = gate.mean(-1, keepdim=True) + gate.std(-1, keepdim=True, unbiased=False) * self.std_multiplier
            gate = F.relu(gate - cutoff)
        return self.down_proj(F.gelu(gate, approximate="tanh") * self.up_proj(x))


class AltUp(nn.Module):
    def __init__(self, hidden: int, n_inputs: int, active: int, eps: float):
        super().__init__()
        self.n, self.active = n_inputs, active
        self.correct_output_scale = nn.Parameter(torch.zeros(hidden))
        self.correction_coefs = nn.Linear(n_inputs, n_inputs, bias=False)
        self.prediction_coefs = nn.Linear(n_inputs, n_inputs**2, bias=False)
        self.modality_router = nn.Linear(hidden, n_inputs, bias=False)
        self.router_norm = Norm(hidden, eps)
        self.router_scale = hidden**-1.0

    def modalities(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.modality_router(self.router_norm(x) * self.router_scale)  # [T, A]
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """h: [A, T, hidden] -> predictions [A, T, hidden]."""
        mods = self.modalities(h[self.active])  # [T, A]
        coefs = self.prediction_coefs(mods).reshape(-1, self.n, self.n).permute(0, 2, 1)  # [T, A, A]
        pred = torch.matmul(h.permute(1, 2, 0), coefs).permute(2, 0, 1)  # [A, T, hidden]
        return (pred + h).contiguous().type_as(h)

    def correct(self, pred: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """pred: [A, T, hidden], activated: [T, hidden] -> corrected [A, T, hidden]."""
        mods = self.modalities(activated)  # [T, A]
        innovation = activated - pred[self.active]  # [T, hidden]
        coefs = (self.correction_coefs(mods) + 1.0).permute(1, 0).unsqueeze(-1)  # [A, T, 1]
        return (innovation.unsqueeze(0) * coefs + pred).contiguous().type_as(activated)

    def scale_output(self, x: torch.Tensor) -> torch.Tensor:
        return (x.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(x)


class Laurel(nn.Module):
    def __init__(self, hidden: int, rank: int, eps: float):
        super().__init__()
        self.linear_left = nn.Linear(hidden, rank, bias=False)
        self.linear_right = nn.Linear(rank, hidden, bias=False)
        self.post_laurel_norm = Norm(hidden, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, ffn: int, sparsity: float, shared: bool):
        super().__init__()
        raw, hidden, eps = cfg.raw, cfg.hidden_size, cfg.rms_norm_eps
        self.active = int(raw.get("altup_active_idx", 0))
        self.correct_scale = bool(raw.get("altup_correct_scale", True))
        self.self_attn = Attention(cfg, layer, shared)
        self.mlp = MLP(hidden, ffn, sparsity)
        self.input_layernorm = Norm(hidden, eps)
        self.post_attention_layernorm = Norm(hidden, eps)
        self.pre_feedforward_layernorm = Norm(hidden, eps)
        self.post_feedforward_layernorm = Norm(hidden, eps)
        self.altup = AltUp(hidden, int(raw.get("altup_num_inputs", 4)), self.active, eps)
        self.laurel = Laurel(hidden, int(raw.get("laurel_rank", 64)), eps)
        per_layer = int(raw["hidden_size_per_layer_input"])
        self.per_layer_input_gate = nn.Linear(hidden, per_layer, bias=False)
        self.per_layer_projection = nn.Linear(per_layer, hidden, bias=False)
        self.post_per_layer_input_norm = Norm(hidden, eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: ForwardView, per_layer: torch.Tensor
    ) -> torch.Tensor:
        """h: [A, T, hidden]; per_layer: [T, per_layer_hidden] -> [A, T, hidden]."""
        pred = self.altup.predict(h)
        active = pred[self.active]  # [T, hidden]
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.post_attention_layernorm(self.self_attn(normed, cos, sin, view))
        x = (active + attn + laurel) / math.sqrt(2)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        corrected = self.altup.correct(pred, x)
        first = corrected[self.active].clone()
        if self.correct_scale:
            first = self.altup.scale_output(first)
        first = F.gelu(self.per_layer_input_gate(first), approximate="tanh") * per_layer  # [T, per_layer_hidden]
        first = self.post_per_layer_input_norm(self.per_layer_projection(first))
        corrected[1:] += first
        return corrected


def sharing_targets(layer_types: tuple[str, ...], n_shared: int) -> dict[int, int]:
    """Reusing layer -> the last layer before the shared ones with the same type."""
    first = len(layer_types) - n_shared
    if n_shared <= 0:
        return {}
    last = {t: i for i, t in enumerate(layer_types[:first])}
    return {i: last[layer_types[i]] for i in range(first, len(layer_types))}


class Gemma3nForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw = cfg.raw
        n_layers, hidden, eps = cfg.n_layers, cfg.hidden_size, cfg.rms_norm_eps
        ffn = raw["intermediate_size"]
        ffn = list(ffn) if isinstance(ffn, list) else [int(ffn)] * n_layers
        sparsity = raw.get("activation_sparsity_pattern") or [0.0] * n_layers
        self.targets = sharing_targets(cfg.layer_types, int(raw.get("num_kv_shared_layers", 0)))
        self.n_altup = int(raw.get("altup_num_inputs", 4))
        self.per_layer_hidden = int(raw["hidden_size_per_layer_input"])
        self.vocab_per_layer = int(raw.get("vocab_size_per_layer_input", cfg.vocab_size))
        self.final_softcap = raw.get("final_logit_softcapping")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, hidden)
        self.model.embed_tokens_per_layer = embedding(self.vocab_per_layer, n_layers * self.per_layer_hidden)
        self.model.per_layer_model_projection = nn.Linear(hidden, n_layers * self.per_layer_hidden, bias=False)
        self.model.per_layer_projection_norm = Norm(self.per_layer_hidden, eps)
        self.model.altup_projections = nn.ModuleList(
            nn.Linear(hidden, hidden, bias=False) for _ in range(1, self.n_altup)
        )
        self.model.altup_unembed_projections = nn.ModuleList(
            nn.Linear(hidden, hidden, bias=False) for _ in range(1, self.n_altup)
        )
        self.model.layers = nn.ModuleList(
            Layer(cfg, i, ffn[i], float(sparsity[i]), i in self.targets) for i in range(n_layers)
        )
        self.model.norm = Norm(hidden, eps)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names
        self.is_local = [t == "sliding_attention" for t in cfg.layer_types]
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)  # rebuilt by init_buffers
        self.rotary_local = Rotary(cfg.rope_local or cfg.rope, cfg.head_dim, cfg.max_position_embeddings)

    def init_buffers(self, device: torch.device) -> None:
        cfg = self.cfg
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings).to(device)
        local = cfg.rope_local or cfg.rope
        self.rotary_local = Rotary(local, cfg.head_dim, cfg.max_position_embeddings).to(device)

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def load_weights(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        """As the base class, minus the key/value weights that real checkpoints may still
        carry for the layers that share another layer's cache."""
        shared = tuple(f"model.layers.{i}.self_attn.{w}." for i in self.targets for w in ("k_", "v_"))
        super().load_weights((f, n, t) for f, n, t in tensors if not n.startswith(shared))

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        cfg = self.cfg
        specs: list[LayerSpec] = []
        for i, kind in enumerate(cfg.layer_types):
            if i in self.targets:
                specs.append(ReuseSpec(self.targets[i]))
            elif kind == "sliding_attention":
                specs.append(SlidingWindowSpec(cfg.n_kv_heads, cfg.head_dim, dtype, cfg.sliding_window))
            else:
                specs.append(FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype))
        return specs

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        rotary = self.rotary_local if self.is_local[layer] else self.rotary
        cos, sin = rotary.cos_sin(delta, scaled=False)
        return rotate(k.float(), cos, sin).to(k.dtype)

    @staticmethod
    def _match_magnitude(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """x rescaled to the RMS ``target`` ([T, 1]) has."""
        new = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))
        return x * target / new

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        m, cfg = self.model, self.cfg
        n_layers, hpl = cfg.n_layers, self.per_layer_hidden
        x = m.embed_tokens(input_ids)  # [T, hidden], in the table's dtype (float32 from blocks)
        x = x * torch.tensor(cfg.hidden_size**0.5, dtype=x.dtype)
        ids = torch.where((input_ids >= 0) & (input_ids < self.vocab_per_layer), input_ids, 0)
        per_layer = m.embed_tokens_per_layer(ids)  # [T, L * hpl]
        per_layer = (per_layer * torch.tensor(hpl**0.5, dtype=per_layer.dtype)).reshape(-1, n_layers, hpl)
        proj = m.per_layer_model_projection(x) * torch.tensor(cfg.hidden_size**-0.5, dtype=x.dtype)
        proj = m.per_layer_projection_norm(proj.reshape(-1, n_layers, hpl))
        per_layer = (proj + per_layer) * torch.rsqrt(torch.tensor(2.0, dtype=x.dtype))  # [T, L, hpl]

        magnitude = torch.mean(x**2, dim=-1, keepdim=True) ** 0.5  # [T, 1]
        h = torch.stack([x, *(self._match_magnitude(p(x), magnitude) for p in m.altup_projections)])  # [A, T, hidden]
        rope = {False: self.rotary.cos_sin(positions), True: self.rotary_local.cos_sin(positions)}
        for i, layer in enumerate(m.layers):
            cos, sin = rope[self.is_local[i]]
            h = layer(h, cos, sin, view, per_layer[:, i, :])
        h = h[:, rows]  # [A, S, hidden]
        magnitude = torch.mean(h[0] ** 2, dim=-1, keepdim=True) ** 0.5
        unembedded = [self._match_magnitude(p(h[j + 1]), magnitude) for j, p in enumerate(m.altup_unembed_projections)]
        return m.norm(torch.stack([h[0], *unembedded]).mean(0))  # [S, hidden]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x).float()  # [S, vocab]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
