"""NVIDIA Nemotron-H and Nemotron 3 (``NemotronHForCausalLM``, issue 52): each layer is
one block, RMSNorm then a single mixer and the residual, the mixer being Mamba2 (``M``),
attention without positional encoding (``*``), a squared-ReLU MLP (``-``) or a mixture
of experts (``E``), as ``layers_block_type`` (or the older ``hybrid_override_pattern``)
lists them.

Only the Mamba2 and attention blocks hold memory, so they are numbered apart: memory
layer i is the i-th block that has one (``memory_ids``). The experts are squared-ReLU
MLPs without a gate; the router scores with a sigmoid, steers the choice with
``e_score_correction_bias``, keeps the best ``topk_group`` of ``n_group`` groups of
experts (a group scored by its two best), weights the chosen by their scores
(renormalized when ``norm_topk_prob``) times ``routed_scaling_factor``, and adds a shared
expert unweighted. With ``moe_latent_size`` the routed experts work in a smaller width
between two projections (Nemotron 3 Super).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import DecoderLM
from engine.models.config import NEMOTRON_PATTERN, ModelConfig
from engine.models.layers import NoPositionAttention, RMSNorm, embedding
from engine.models.mamba2 import Mamba2Mixer, SSMShape, dt_limit
from engine.models.moe import SigmoidRouter, run_experts
from memory import ForwardView, FullAttentionSpec, LayerSpec


class Relu2MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, bias: bool = False):
        super().__init__()
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.relu(self.up_proj(x)).square())


class NemotronMoE(nn.Module):
    def __init__(self, raw: dict, hidden: int, bias: bool):
        super().__init__()
        latent = raw.get("moe_latent_size")
        width = int(latent) if latent else hidden
        self.gate = SigmoidRouter(raw, hidden)
        ffn = int(raw["moe_intermediate_size"])
        self.experts = nn.ModuleList(Relu2MLP(width, ffn, bias) for _ in range(int(raw["n_routed_experts"])))
        self.shared_experts = Relu2MLP(hidden, int(raw["moe_shared_expert_intermediate_size"]), bias)
        if latent:
            self.fc1_latent_proj = nn.Linear(hidden, width, bias=bias)
            self.fc2_latent_proj = nn.Linear(width, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        weights, idx = self.gate(x)
        h = self.fc1_latent_proj(x) if hasattr(self, "fc1_latent_proj") else x
        h = run_experts(h, self.experts, weights.to(h.dtype), idx)
        h = self.fc2_latent_proj(h) if hasattr(self, "fc2_latent_proj") else h
        return h + self.shared_experts(x)


class NemotronBlock(nn.Module):
    def __init__(self, kind: str, mixer: nn.Module, hidden: int, eps: float):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(hidden, eps)
        self.mixer = mixer

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        h = self.norm(x)
        return x + (self.mixer(h, view) if self.kind in ("linear_attention", "full_attention") else self.mixer(h))


def block_kinds(raw: dict) -> list[str]:
    """Each block's mixer: linear_attention (Mamba2), full_attention, mlp or moe."""
    given = raw.get("layers_block_type") or raw.get("layer_types")
    if given is None:
        given = [NEMOTRON_PATTERN.get(c, c) for c in raw.get("hybrid_override_pattern") or ""]
    return [{"mamba": "linear_attention", "attention": "full_attention"}.get(k, k) for k in given]


class NemotronHForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        raw, hidden = cfg.raw, cfg.hidden_size
        self.kinds = block_kinds(raw)
        with_memory = [i for i, k in enumerate(self.kinds) if k in ("linear_attention", "full_attention")]
        self.memory_ids = {layer: i for i, layer in enumerate(with_memory)}  # block -> memory layer
        eps = float(raw.get("layer_norm_epsilon") or cfg.rms_norm_eps)
        self.ssm = SSMShape(
            hidden=hidden,
            n_heads=int(raw["mamba_num_heads"]),
            head_dim=int(raw["mamba_head_dim"]),
            state_size=int(raw["ssm_state_size"]),
            n_groups=int(raw.get("n_groups") or 1),
            conv_kernel=int(raw.get("conv_kernel") or 4),
            chunk=int(raw.get("chunk_size") or 128),
            eps=eps,
            use_bias=bool(raw.get("use_bias", False)),
            use_conv_bias=bool(raw.get("use_conv_bias", True)),
            dt_limit=dt_limit(raw),
        )
        self.backbone = nn.Module()
        self.backbone.embeddings = embedding(cfg.vocab_size, hidden)
        self.backbone.layers = nn.ModuleList(
            NemotronBlock(k, self._mixer(i, k), hidden, eps) for i, k in enumerate(self.kinds)
        )
        self.backbone.norm_f = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names

    def _mixer(self, layer: int, kind: str) -> nn.Module:
        cfg, bias = self.cfg, bool(self.cfg.raw.get("mlp_bias", False))
        if kind == "linear_attention":
            return Mamba2Mixer(self.ssm, self.memory_ids[layer])
        if kind == "full_attention":
            return NoPositionAttention(
                cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, self.memory_ids[layer], cfg.attention_bias
            )
        if kind == "moe":
            return NemotronMoE(cfg.raw, cfg.hidden_size, bias)
        return Relu2MLP(cfg.hidden_size, cfg.intermediate_size, bias)

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.backbone.embeddings.weight

    def init_buffers(self, device: torch.device) -> None:
        return None  # nothing computed

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        """One spec per block that has memory, in order (``memory_ids``)."""
        cfg = self.cfg
        return [
            self.ssm.spec(dtype)
            if self.kinds[i] == "linear_attention"
            else FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype)
            for i in self.memory_ids
        ]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return k  # keys carry no position

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.backbone.embeddings(input_ids)  # [T, hidden]
        for block in self.backbone.layers:
            x = block(x, view)
        return self.backbone.norm_f(x[rows])  # [S, hidden]
