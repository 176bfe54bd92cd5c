"""GLM-4 MoE (``Glm4MoeForCausalLM``: GLM-4.5 / 4.6 / Air, issue 53): attention with a
bias on q/k/v where ``attention_bias`` (none on the output), q/k normed per head where
``use_qk_norm``, rotate-half over the first ``partial_rotary_factor`` of each head (a
half in the released models); the first ``first_k_dense_replace`` layers a dense MLP,
the rest routed experts chosen by DeepSeek-V3's sigmoid router with a correction bias
and groups (engine/models/moe.py's ``SigmoidRouter``) plus ``n_shared_experts`` shared
ones as one MLP. The released folders carry ``num_nextn_predict_layers`` extra layers
after the last (a next-token-prediction head): their tensors are skipped."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import GatedMLP
from engine.models.moe import SigmoidRouter, run_experts, split_fused_experts


class Glm4MoE(nn.Module):
    def __init__(self, raw: dict, hidden: int):
        super().__init__()
        ffn = int(raw["moe_intermediate_size"])
        self.gate = SigmoidRouter(raw, hidden)
        self.experts = nn.ModuleList(GatedMLP(hidden, ffn) for _ in range(int(raw["n_routed_experts"])))
        self.shared_experts = GatedMLP(hidden, ffn * int(raw.get("n_shared_experts") or 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        weights, idx = self.gate(x)  # [T, k]
        return run_experts(x, self.experts, weights.to(x.dtype), idx) + self.shared_experts(x)


class Glm4MoeForCausalLM(DecoderLM):
    o_bias = False  # q/k/v carry the config's bias, the output projection none

    def __init__(self, cfg: ModelConfig):
        self.qk_norm = bool(cfg.raw.get("use_qk_norm"))
        super().__init__(cfg)
        first_dense = int(cfg.raw.get("first_k_dense_replace") or 0)
        for i, layer in enumerate(self.model.layers):
            if i >= first_dense:
                layer.mlp = Glm4MoE(cfg.raw, cfg.hidden_size)
        self._shards["gate_up_proj"] = [None, None]  # gate and up: halves, whatever the layer's width

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        n = self.cfg.n_layers
        for file, name, tensor in super()._renamed(tensors):
            layer = re.match(r"model\.layers\.(\d+)\.", name)
            if layer is not None and int(layer.group(1)) >= n:  # the next-token-prediction layers
                continue
            for part, t in split_fused_experts(name, tensor):
                yield file, part, t
