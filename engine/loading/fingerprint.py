"""The model fingerprint written into slot files: a cache is only valid for the model
(and dtype) that computed it."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from engine.kernels.block_model import named_block_weights
from engine.models.config import ModelConfig

_SAMPLE = 512  # elements read from the start, middle and end of each parameter


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter's name, dtype, shape and three samples of its values.

    Cheap for any model size, yet two checkpoints of the same shapes but different
    training (or seeds) differ in it. Call before the weights are repacked.
    """
    h = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors |= {f"{name}.{w.qtype.name}": w.data for name, w in named_block_weights(model)}  # their bytes
    for name, param in sorted(tensors.items()):
        flat = param.detach().reshape(-1)  # [numel]
        h.update(f"{name}:{param.dtype}:{tuple(param.shape)}\n".encode())
        mid = max(0, flat.numel() // 2 - _SAMPLE // 2)
        for part in (flat[:_SAMPLE], flat[mid : mid + _SAMPLE], flat[-_SAMPLE:]):
            h.update(part.cpu().contiguous().view(torch.uint8).numpy())
    return h.hexdigest()


def model_fingerprint(cfg: ModelConfig, model: nn.Module, dtype: str) -> dict[str, str]:
    return {
        "architecture": cfg.architecture,
        "config_sha256": cfg.fingerprint,
        "weights_sha256": weights_digest(model),
        "dtype": dtype,
    }
