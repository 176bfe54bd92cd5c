"""Model definitions: one file per architecture, built from ``layers``."""

from engine.models import gemma, gemma3n, llama, mamba2, mistral, qwen2, qwen3  # noqa: F401  (register)
from engine.models.registry import MODELS, model_class

__all__ = ["MODELS", "model_class"]
