"""``architectures[0]`` -> model class. Model files register themselves on import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import UnsupportedArchitecture

if TYPE_CHECKING:
    from engine.models.base import DecoderLM

MODELS: dict[str, type[DecoderLM]] = {}
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3n_text": "Gemma3nForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "jamba": "JambaForCausalLM",
}


def register(name: str):
    def deco(cls):
        MODELS[name] = cls
        return cls

    return deco


def model_class(architecture: str, source: str = "config.json") -> type[DecoderLM]:
    import engine.models  # noqa: F401  (registers every architecture)

    name = MODEL_TYPES.get(architecture, architecture)
    if name not in MODELS:
        raise UnsupportedArchitecture(
            f"{source}: field 'architectures' names '{architecture}', which slotserve does not support; "
            f"supported: {', '.join(sorted(MODELS))}"
        )
    return MODELS[name]
