"""Model definitions: one file per architecture, built from ``layers``."""

from engine.models import (  # noqa: F401  (each registers its architectures)
    falcon_h1,
    gemma,
    gemma3n,
    granite_hybrid,
    jamba,
    llama,
    mamba2,
    mistral,
    qwen2,
    qwen3,
)
from engine.models.registry import MODELS, model_class

__all__ = ["MODELS", "model_class"]
