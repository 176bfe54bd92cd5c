"""LoRA adapters (llama-server's ``--lora`` / ``--lora-scaled``): a PEFT folder
(``adapter_config.json`` + ``adapter_model.safetensors``), read into per-module low-rank
pairs: for module ``m`` of layer ``i``, ``delta(x) = (x @ A.T) @ B.T * scaling`` with
scaling ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), as PEFT computes it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.errors import CheckpointError

_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass
class LoRAAdapter:
    path: str
    scaling: float
    # (layer, module) -> (A [r, in], B [out, r])
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def load_lora(path: str | Path, dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """Raises CheckpointError naming what is missing or not served (a module outside
    attention and MLP projections, DoRA, a bias)."""
    folder = Path(path)
    config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise CheckpointError(f"{folder}: a LoRA adapter is a folder of adapter_config.json, adapter_model.safetensors")
    cfg = json.loads(config_path.read_text())
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora"):
        raise CheckpointError(f"{folder}: only plain LoRA adapters are served (peft_type LORA, no DoRA)")
    r, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    scaling = alpha / (r**0.5 if cfg.get("use_rslora") else r)
    adapter = LoRAAdapter(str(folder), scaling)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(str(weights)).items():
        m = _KEY.search(name)
        if m is None:
            raise CheckpointError(f"{folder}: tensor {name!r} adapts no attention or MLP projection")
        halves.setdefault((int(m[1]), m[2]), {})[m[3]] = tensor.to(dtype)
    for key, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise CheckpointError(f"{folder}: layer {key[0]} {key[1]} has lora_{''.join(pair)} alone")
        adapter.pairs[key] = (pair["A"], pair["B"])
    return adapter
