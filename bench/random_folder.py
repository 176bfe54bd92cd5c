"""A Hugging Face folder of random weights at a bench shape, written without
transformers' slow initialization pass (the bench model scripts' shared step)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def write_random_folder(
    folder: Path, config_cls, model_cls, shape: dict, vector: Callable[[str], float | None]
) -> None:
    """``model_cls(config_cls(**shape))`` with every matrix drawn from N(0, 0.02^2) and
    every vector filled with ``vector(name)`` (None: drawn as the matrices), saved
    under ``folder`` with the demo model's tokenizer (byte-level BPE with merges, which
    llama-server requires)."""
    from engine import DEMO_MODEL

    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_cls(config_cls(**shape))
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = vector(name) if p.dim() == 1 else None
            p.normal_(0, 0.02) if value is None else p.fill_(value)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    print(f"{folder.name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", file=sys.stderr)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / file, folder / file)
