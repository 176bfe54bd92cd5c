"""Qwen's mixtures of experts with plain attention (issue 53): Qwen3-MoE
(``Qwen3MoeForCausalLM``: Qwen3's attention, q/k normed per head; every MLP routed
experts, softmax over all experts then top-k, renormalized where
``norm_topk_prob``) and Qwen2-MoE (``Qwen2MoeForCausalLM``: Qwen2's attention with a
bias on q/k/v; the experts plus a shared expert gated by sigmoid(shared_expert_gate(x))).
A layer is sparse unless it is in ``mlp_only_layers`` or off ``decoder_sparse_step``;
the dense ones take ``intermediate_size``. Experts run grouped by expert
(engine/models/moe.py's ``SharedExpertMoE``), one matmul each over the tokens that chose
it; from a GGUF, each expert's rows are read from the file's stacked blocks."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.moe import SharedExpertMoE, split_fused_experts


class _QwenMoE(DecoderLM):
    shared = False  # whether the experts come with a gated shared expert

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        raw = cfg.raw
        n_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
        step = int(raw.get("decoder_sparse_step") or 1)
        for i, layer in enumerate(self.model.layers):
            if n_experts and i not in (raw.get("mlp_only_layers") or []) and (i + 1) % step == 0:
                layer.mlp = SharedExpertMoE(
                    cfg.hidden_size,
                    int(raw["moe_intermediate_size"]),
                    int(raw.get("shared_expert_intermediate_size") or 0) if self.shared else 0,
                    n_experts,
                    int(raw["num_experts_per_tok"]),
                    bool(raw.get("norm_topk_prob", False)),
                )
        self._shards["gate_up_proj"] = [None, None]  # gate and up: halves, whatever the layer's width

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        for file, name, tensor in super()._renamed(tensors):
            for part, t in split_fused_experts(name, tensor):  # stacked experts, where a checkpoint has them
                yield file, part, t


class Qwen3MoeForCausalLM(_QwenMoE):
    qk_norm = True


class Qwen2MoeForCausalLM(_QwenMoE):
    qkv_bias = True
    shared = True
