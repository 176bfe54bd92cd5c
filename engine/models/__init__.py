"""Model definitions: one file per architecture, built from ``layers``."""

from engine.models import gemma, gemma3n, granite_hybrid, llama, mamba2, mistral, qwen2, qwen3  # noqa: F401
from engine.models.registry import MODELS, model_class

__all__ = ["MODELS", "model_class"]
