"""LoRA applied per row: a projection wrapped so that each token's output gains
``scale[row] * (x @ A.T) @ B.T * scaling`` for every adapter, with each row's scale
from its own sequence, so requests with different adapters (or none) share one batch
and one matmul of the base weights. Fused projections (q/k/v, gate/up) take each
adapter pair on its slice of the output."""

from __future__ import annotations

import torch
from torch import nn

from engine.errors import CheckpointError

# a PEFT module name -> (the block holding it, our fused module, which slice of its output)
TARGETS = {
    "q_proj": ("self_attn", "qkv_proj", "q"),
    "k_proj": ("self_attn", "qkv_proj", "k"),
    "v_proj": ("self_attn", "qkv_proj", "v"),
    "o_proj": ("self_attn", "o_proj", None),
    "gate_proj": ("mlp", "gate_up_proj", "gate"),
    "up_proj": ("mlp", "gate_up_proj", "up"),
    "down_proj": ("mlp", "down_proj", None),
}


class LoRAState:
    """Set by the runner around each forward: each adapter's scale for each row."""

    def __init__(self, n_adapters: int):
        self.n_adapters = n_adapters
        self.scales: torch.Tensor | None = None  # [n_adapters, T] float32
        self.active: list[int] = []  # adapters some row of this step uses


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, state: LoRAState):
        super().__init__()
        self.base, self.state = base, state
        self.parts: list[tuple[int, torch.Tensor, torch.Tensor, int, float]] = []  # (adapter, A, B, offset, scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        state = self.state
        if state.scales is None or not state.active:
            return y
        for index, a, b, offset, scaling in self.parts:
            if index in state.active:
                rows = state.scales[index].to(x.dtype)[:, None] * scaling  # [T, 1]
                y[:, offset : offset + b.shape[0]] += ((x @ a.T) * rows) @ b.T  # [T, width]
        return y


def _slice(block: nn.Module, which: str | None) -> tuple[int, int | None]:
    """(offset, width) of a fused output's slice (width None: the whole output)."""
    if which is None:
        return 0, None
    if which in ("q", "k", "v"):
        q, kv = block.q_size, block.kv_size
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[which]
    return {"gate": (0, block.ffn), "up": (block.ffn, block.ffn)}[which]


def install_lora(model: nn.Module, adapters: list) -> LoRAState:
    """Wrap the projections the adapters touch (engine/loading/lora.py's pairs); raises
    CheckpointError for a module or shape this model does not have."""
    state = LoRAState(len(adapters))
    layers = model.model.layers
    for index, adapter in enumerate(adapters):
        for (layer, name), (a, b) in adapter.pairs.items():
            if name not in TARGETS or layer >= len(layers):
                raise CheckpointError(f"{adapter.path}: layer {layer} {name} is not a projection this model has")
            block = getattr(layers[layer], TARGETS[name][0], None)
            module = getattr(block, TARGETS[name][1], None) if block is not None else None
            if module is None:
                raise CheckpointError(f"{adapter.path}: layer {layer} has no {name} to adapt")
            offset, width = _slice(block, TARGETS[name][2])
            if not isinstance(module, LoRALinear):
                module = LoRALinear(module, state)
                setattr(block, TARGETS[name][1], module)
            out = width if width is not None else getattr(module.base, "out_features", b.shape[0])
            if b.shape[0] != out or a.shape[1] != getattr(module.base, "in_features", a.shape[1]):
                shapes = f"{tuple(a.shape)}, {tuple(b.shape)}"
                raise CheckpointError(f"{adapter.path}: layer {layer} {name}: A, B of shapes {shapes} do not fit")
            module.parts.append((index, a, b, offset, adapter.scaling))
    return state
