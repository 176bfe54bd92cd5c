"""SmolLM3 (``SmolLM3ForCausalLM``, issue 53): Llama with rotary positions left out of
some layers ("NoPE"). ``no_rope_layers`` lists 1 for a layer that rotates, 0 for one
that does not; configs without it take every ``no_rope_layer_interval``-th layer
(default 4, llama.cpp's fixed rule) as position-free. Such a layer gets the identity
rotation (cos 1, sin 0: its q and k pass unchanged, bit for bit), and its stored keys are
never re-rotated by a context shift."""

from __future__ import annotations

import torch

from engine.models.base import DecoderLM
from engine.models.config import ModelConfig


class SmolLM3ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        raw, n = cfg.raw, cfg.n_layers
        every = int(raw.get("no_rope_layer_interval") or 4)
        flags = raw.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n)]
        self.turns = [bool(f) for f in flags[:n]]  # per layer: rotates its q and k

    def layer_ropes(self, cos: torch.Tensor, sin: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        still = (torch.ones_like(cos), torch.zeros_like(sin))  # the identity rotation
        return [(cos, sin) if turns else still for turns in self.turns]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return super().rope_shift(layer, k, delta) if self.turns[layer] else k
