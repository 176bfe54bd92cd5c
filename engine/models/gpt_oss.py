"""gpt-oss (``GptOssForCausalLM``, issue 53): attention with biases on every projection and
a learned *sink* logit per head in the softmax (weight without a value: the memory's
``attend(..., sinks=)``), sliding-window layers (``sliding_window``, 128 in the releases)
alternating with full ones as ``layer_types`` says, YaRN rotary; every MLP a mixture of
experts: a router with a bias whose top-k logits are softmaxed, and experts whose gate
and up come interleaved (column 2i the gate's, 2i + 1 the up's) with biases, through a
clamped SwiGLU: gate <= limit, -limit <= up <= limit, (up + 1) * gate * sigmoid(alpha *
gate), then down with its bias.

Checkpoint layout (transformers 5, as published after dequantization): per layer
``mlp.router.{weight,bias}`` and the stacked ``mlp.experts.gate_up_proj`` [E, hidden,
2F] (x @ W), ``gate_up_proj_bias`` [E, 2F], ``down_proj`` [E, F, hidden],
``down_proj_bias`` [E, hidden]: at load each expert becomes a fused ``gate_up_proj``
(gate rows, then up rows) and a ``down_proj``, as the other families' experts."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from engine.kernels import moe_kernel
from engine.models import rowwise
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import Attention
from engine.models.moe import run_experts
from memory import ForwardView


class SinkAttention(Attention):
    """The layer's attention with a sink logit per query head (``sinks`` [H])."""

    def __init__(self, shape, layer: int):
        super().__init__(shape, layer)
        self.sinks = nn.Parameter(torch.zeros(shape.n_heads))

    def attend(self, view: ForwardView, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return view.attend(self.layer, q, k, v, sinks=self.sinks)


class ClampedExpert(nn.Module):
    """down((up + 1) * glu(gate)) with gate and up clamped: one gpt-oss expert."""

    def __init__(self, hidden: int, ffn: int, alpha: float, limit: float):
        super().__init__()
        self.ffn, self.alpha, self.limit = ffn, alpha, limit
        self.fused_act = (1, alpha, limit)  # engine/kernels/moe_kernel.py's clamped SwiGLU
        self.gate_up_proj = nn.Linear(hidden, 2 * ffn)  # gate rows, then up rows
        self.down_proj = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.ffn, dim=-1)  # [T, F] each
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return self.down_proj((up + 1) * (gate * rowwise.sigmoid(gate * self.alpha)))


class GptOssMoE(nn.Module):
    def __init__(self, raw: dict, hidden: int):
        super().__init__()
        n, ffn = int(raw["num_local_experts"]), int(raw["intermediate_size"])
        self.top_k = int(raw["num_experts_per_tok"])
        self.router = rowwise.Linear(hidden, n)
        alpha, limit = float(raw.get("swiglu_alpha", 1.702)), float(raw.get("swiglu_limit", 7.0))
        self.experts = nn.ModuleList(ClampedExpert(hidden, ffn, alpha, limit) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]: each token's top-k experts, weighted by the
        softmax of their router logits."""
        fused = moe_kernel.route(x, self.router, self.top_k, "topk_softmax")
        if fused is not None:
            return run_experts(x, self.experts, *fused)
        top, idx = self.router(x).float().topk(self.top_k, dim=-1)  # [T, k]
        return run_experts(x, self.experts, torch.softmax(top, dim=-1).to(x.dtype), idx)


class GptOssForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        for layer in self.model.layers:
            shape, index = layer.self_attn.s, layer.self_attn.layer
            layer.self_attn = SinkAttention(shape, index)
            layer.mlp = GptOssMoE(cfg.raw, cfg.hidden_size)

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        for file, name, tensor in super()._renamed(tensors):
            yield from ((file, n, t) for n, t in _experts(name, tensor))


def _experts(name: str, t: torch.Tensor) -> Iterable[tuple[str, torch.Tensor]]:
    """The stacked experts as each expert's fused gate_up (gate rows, then up rows) and
    down, weights [out, in]; any other tensor as it is."""
    m = re.match(r"(.*\.experts)\.(gate_up_proj|down_proj)(_bias)?$", name)
    if m is None:
        yield name, t
        return
    base, kind, bias = m.groups()
    for e, w in enumerate(t):
        if kind == "gate_up_proj":
            w = w if bias else w.T  # [2F(, hidden)], interleaved gate, up
            w = torch.cat([w[0::2], w[1::2]])  # gate rows, then up rows
        elif not bias:
            w = w.T  # [hidden, F]
        yield f"{base}.{e}.{kind}.{'bias' if bias else 'weight'}", w
