"""The Qwen3.5 family's mixture-of-experts members (issue 52): Qwen3.5-MoE
(``Qwen3_5MoeForCausalLM``: every layer's MLP is experts) and Qwen3-Next
(``Qwen3NextForCausalLM``: experts every ``decoder_sparse_step`` layers but the
``mlp_only_layers``; its Gated DeltaNet projections fused per key head). The
multimodal folders: qwen3_5_vl.py.

Qwen3-Next's ``in_proj_qkvz`` holds, for each key head, its q, k, then its value heads'
v and z; ``in_proj_ba`` each key head's b then a. They load split into Qwen3.5's
``in_proj_qkv`` (q of every head, k of every head, v grouped by key head), ``in_proj_z``,
``in_proj_b`` and ``in_proj_a``, so both models run the same layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.models.layers import GatedMLP
from engine.models.moe import SharedExpertMoE, split_fused_experts
from engine.models.qwen3_5 import Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    norm_topk_default = True  # Qwen3.5-MoE always renormalizes the chosen weights

    def is_sparse(self, layer: int) -> bool:
        return True

    def mlp(self, layer: int) -> nn.Module:
        raw, hidden = self.cfg.raw, self.cfg.hidden_size
        if not self.is_sparse(layer):
            return GatedMLP(hidden, self.cfg.intermediate_size)
        return SharedExpertMoE(
            hidden,
            int(raw["moe_intermediate_size"]),
            int(raw["shared_expert_intermediate_size"]),
            int(raw["num_experts"]),
            int(raw["num_experts_per_tok"]),
            bool(raw.get("norm_topk_prob", self.norm_topk_default)),
        )

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        for file, name, tensor in super()._renamed(tensors):
            for part, t in split_fused_experts(name, tensor):
                yield file, part, t


class Qwen3NextForCausalLM(Qwen3_5MoeForCausalLM):
    def is_sparse(self, layer: int) -> bool:
        raw = self.cfg.raw
        step = int(raw.get("decoder_sparse_step") or 1)
        return (
            layer not in (raw.get("mlp_only_layers") or [])
            and int(raw.get("num_experts") or 0) > 0
            and (layer + 1) % step == 0
        )

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        for file, name, tensor in super()._renamed(tensors):
            for part, t in self._unfused(name, tensor):
                yield file, part, t

    def _unfused(self, name: str, w: torch.Tensor) -> Iterable[tuple[str, torch.Tensor]]:
        """``in_proj_qkvz`` / ``in_proj_ba`` [rows, hidden] -> Qwen3.5's four projections."""
        raw = self.cfg.raw
        hk, hv = int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"])
        dk, dv, per = int(raw["linear_key_head_dim"]), int(raw["linear_value_head_dim"]), hv // hk
        base = name.rsplit(".", 2)[0]
        if name.endswith("in_proj_qkvz.weight"):
            q, k, v, z = w.view(hk, -1, w.shape[-1]).split([dk, dk, per * dv, per * dv], dim=1)  # [Hk, rows, H]
            yield f"{base}.in_proj_qkv.weight", torch.cat([q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)])
            yield f"{base}.in_proj_z.weight", z.flatten(0, 1)
        elif name.endswith("in_proj_ba.weight"):
            b, a = w.view(hk, 2 * per, w.shape[-1]).split([per, per], dim=1)  # [Hk, per, H]
            yield f"{base}.in_proj_b.weight", b.flatten(0, 1)
            yield f"{base}.in_proj_a.weight", a.flatten(0, 1)
        else:
            yield name, w
