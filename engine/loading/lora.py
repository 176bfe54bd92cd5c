"""LoRA adapters (llama-server's ``--lora`` / ``--lora-scaled``): a PEFT folder
(``adapter_config.json`` + ``adapter_model.safetensors``) or a GGUF LoRA file
(engine/loading/gguf/lora.py), read into per-module low-rank pairs. A PEFT adapter's
scaling is ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), as PEFT computes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.errors import CheckpointError
from engine.loading.gguf.checkpoint import is_gguf
from engine.loading.gguf.lora import load_gguf_lora
from engine.loading.lora_adapter import LoRAAdapter
from engine.models.config import ModelConfig

_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def load_lora(path: str | Path, base: ModelConfig, dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """The adapter at ``path`` for the model ``base`` describes. Raises CheckpointError
    naming what is missing or not served (a module outside attention and MLP
    projections, DoRA, a bias, a GGUF adapter of another architecture)."""
    if is_gguf(Path(path)):
        return load_gguf_lora(Path(path), base, dtype)
    folder = Path(path)
    config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise CheckpointError(
            f"{folder}: a LoRA adapter is a GGUF LoRA file or a folder of adapter_config.json, "
            "adapter_model.safetensors"
        )
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
