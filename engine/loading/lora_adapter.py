"""A LoRA adapter as the engine applies it (engine/kernels/lora_linear.py), whatever file
it came from (engine/loading/lora.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoRAAdapter:
    """For module ``m`` of layer ``i``: ``delta(x) = (x @ A.T) @ B.T * scaling``."""

    path: str
    scaling: float
    task_name: str = ""  # what a GGUF adapter says of itself (adapter.lora.task_name, .prompt_prefix)
    prompt_prefix: str = ""
    # (layer, PEFT module name: q_proj, ..., down_proj) -> (A [r, in], B [out, r])
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
