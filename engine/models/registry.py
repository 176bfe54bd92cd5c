"""``architectures[0]`` (or ``model_type``) -> model class: one table, read by loading."""

from __future__ import annotations

from engine.errors import UnsupportedArchitecture
from engine.models.base import DecoderLM
from engine.models.falcon_h1 import FalconH1ForCausalLM
from engine.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM
from engine.models.gemma3_vision import Gemma3ForConditionalGeneration
from engine.models.gemma3n import Gemma3nForCausalLM
from engine.models.gemma4 import Gemma4ForCausalLM, Gemma4ForConditionalGeneration
from engine.models.glm4_moe import Glm4MoeForCausalLM
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.granite_hybrid import GraniteMoeHybridForCausalLM
from engine.models.jamba import JambaForCausalLM
from engine.models.lfm2 import Lfm2ForCausalLM, Lfm2MoeForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.mamba2 import Mamba2ForCausalLM
from engine.models.mistral import MistralForCausalLM
from engine.models.nemotron_h import NemotronHForCausalLM
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.qwen3_5 import Qwen3_5ForCausalLM
from engine.models.qwen3_5_vl import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration
from engine.models.qwen3_next import Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM
from engine.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from engine.models.smollm3 import SmolLM3ForCausalLM
from engine.models.smolvlm import Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration

MODELS: dict[str, type[DecoderLM]] = {
    cls.__name__: cls
    for cls in (
        LlamaForCausalLM,
        Qwen2ForCausalLM,
        Qwen3ForCausalLM,
        Qwen2MoeForCausalLM,
        Qwen3MoeForCausalLM,
        SmolLM3ForCausalLM,
        Phi3ForCausalLM,
        Glm4MoeForCausalLM,
        GptOssForCausalLM,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeForConditionalGeneration,
        Qwen3NextForCausalLM,
        MistralForCausalLM,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3ForConditionalGeneration,
        Gemma3nForCausalLM,
        Gemma4ForCausalLM,
        Gemma4ForConditionalGeneration,
        Mamba2ForCausalLM,
        GraniteMoeHybridForCausalLM,
        FalconH1ForCausalLM,
        JambaForCausalLM,
        Lfm2ForCausalLM,
        Lfm2MoeForCausalLM,
        NemotronHForCausalLM,
        SmolVLMForConditionalGeneration,
        Idefics3ForConditionalGeneration,
        Qwen2_5_VLForConditionalGeneration,
    )
}
MODEL_TYPES = {  # config.json's model_type -> the class name
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3n_text": "Gemma3nForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
    "gemma4": "Gemma4ForConditionalGeneration",
    "mamba2": "Mamba2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "jamba": "JambaForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
}


BARE_MODELS = {  # a bare model's class (no LM head; decoder embedding models) -> the class that loads it
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",  # e5-mistral, SFR-Embedding-Mistral
    "Qwen2Model": "Qwen2ForCausalLM",  # gte-Qwen2
    "Qwen3Model": "Qwen3ForCausalLM",  # Qwen3-Embedding saved by AutoModel
}


def model_class(architecture: str, source: str = "config.json") -> type[DecoderLM]:
    """Raises UnsupportedArchitecture naming the supported ones."""
    name = BARE_MODELS.get(architecture) or MODEL_TYPES.get(architecture, architecture)
    if name not in MODELS:
        raise UnsupportedArchitecture(
            f"{source}: field 'architectures' names '{architecture}', which slotserve does not support; "
            f"supported: {', '.join(sorted(MODELS))}"
        )
    return MODELS[name]
