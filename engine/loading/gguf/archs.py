"""What each GGUF architecture is as a Hugging Face checkpoint: the config.json its
metadata stands for, and how each Hugging Face tensor is found (renamed through the
``gguf`` package's ``TensorNameMap``, then the architecture's hook in tensors.py undoes
what the converter changed)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.loading.gguf.configs_attention import (
    gemma3n_config,
    gemma4_config,
    gemma_config,
    glm4_moe_config,
    gpt_oss_config,
    llama_like_config,
    phi3_config,
    qwen_moe_config,
    smollm3_config,
)
from engine.loading.gguf.configs_hybrid import (
    falcon_h1_config,
    granite_hybrid_config,
    jamba_config,
    lfm2_config,
    mamba2_config,
    nemotron_h_config,
    qwen35_config,
)
from engine.loading.gguf.tensors import (
    GGUFMetadata,
    Read,
    expert_hook,
    gemma3n_tensor,
    gemma4_tensor,
    gemma_tensor,
    gpt_oss_tensor,
    granite_tensor,
    jamba_tensor,
    lfm2_tensor,
    llama_tensor,
    phi3_tensor,
    qwen35_tensor,
    ssm_tensor,
)


@dataclass(frozen=True)
class GGUFArch:
    hf_class: str
    config: Callable[[GGUFMetadata], dict]
    # (checkpoint, HF name, GGUF name the table gives, read) -> the HF tensor, or None
    # where the plain renamed tensor is right
    tensor: Callable[[GGUFMetadata, str, str, Read], torch.Tensor | None] | None = None
    # whether 2-D weights may stay in blocks (every architecture today): a ``tensor``
    # hook only moves the rows of a kept weight; what it rebuilds (Granite's split
    # gate/up, Jamba's and Gemma 3n's stacked tensors) is read in float, as the plan
    # keeps only weights stored under their own name
    keeps_blocks: bool = True


def gguf_name(ck: GGUFMetadata, names: Any, hf_name: str) -> str | None:
    """The GGUF tensor the converter wrote for ``hf_name`` (None: none matches)."""
    lookup = re.sub(r"\.dt_bias$", ".dt_proj.bias", hf_name)  # the converter renames these first
    lookup = re.sub(r"_scale$", "_scale.weight", lookup)
    lookup = re.sub(r"e_score_correction_bias$", "e_score_correction.bias", lookup)  # the converter's rename
    found = names.get_name(lookup, try_suffixes=(".weight", ".bias"))
    if found is not None and found not in ck.tensors and found.endswith(".weight") and found[:-7] in ck.tensors:
        return found[:-7]  # a few names are written without ".weight" (Falcon-H1's ffn_norm)
    for suffix in (".bias", ".weight"):  # an HF name without a suffix written with one (LFM2-MoE's
        if found is not None and found not in ck.tensors and f"{found}{suffix}" in ck.tensors:  # expert_bias,
            return f"{found}{suffix}"  # Gemma 4's layer_scalar)
    return found


ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", llama_like_config("llama"), llama_tensor),
    "qwen2": GGUFArch("Qwen2ForCausalLM", llama_like_config("qwen2")),
    "qwen2vl": GGUFArch("Qwen2ForCausalLM", llama_like_config("qwen2")),  # Qwen2-VL's language model (M-RoPE sections)
    "qwen3": GGUFArch("Qwen3ForCausalLM", llama_like_config("qwen3")),
    "smollm3": GGUFArch("SmolLM3ForCausalLM", smollm3_config, llama_tensor),
    "phi3": GGUFArch("Phi3ForCausalLM", phi3_config, phi3_tensor),
    "gpt-oss": GGUFArch("GptOssForCausalLM", gpt_oss_config, gpt_oss_tensor),
    "glm4moe": GGUFArch("Glm4MoeForCausalLM", glm4_moe_config, expert_hook),
    "qwen3moe": GGUFArch("Qwen3MoeForCausalLM", qwen_moe_config("qwen3_moe"), expert_hook),
    "qwen2moe": GGUFArch("Qwen2MoeForCausalLM", qwen_moe_config("qwen2_moe"), expert_hook),
    "gemma2": GGUFArch("Gemma2ForCausalLM", gemma_config("gemma2"), gemma_tensor),
    "gemma3": GGUFArch("Gemma3ForCausalLM", gemma_config("gemma3_text"), gemma_tensor),
    "gemma3n": GGUFArch("Gemma3nForCausalLM", gemma3n_config, gemma3n_tensor),
    "gemma4": GGUFArch("Gemma4ForCausalLM", gemma4_config, gemma4_tensor),
    "mamba2": GGUFArch("Mamba2ForCausalLM", mamba2_config, ssm_tensor),
    "granitehybrid": GGUFArch("GraniteMoeHybridForCausalLM", granite_hybrid_config, granite_tensor),
    "falcon-h1": GGUFArch("FalconH1ForCausalLM", falcon_h1_config, ssm_tensor),
    "jamba": GGUFArch("JambaForCausalLM", jamba_config, jamba_tensor),
    "lfm2": GGUFArch("Lfm2ForCausalLM", lfm2_config, lfm2_tensor),
    "lfm2moe": GGUFArch("Lfm2MoeForCausalLM", lfm2_config, lfm2_tensor),
    # Mamba2's tensors, stacked experts; with transformers 5 installed the converter writes
    # every Nemotron-H as nemotron_h_moe (its config always lists expert fields)
    "nemotron_h": GGUFArch("NemotronHForCausalLM", nemotron_h_config, jamba_tensor),
    "nemotron_h_moe": GGUFArch("NemotronHForCausalLM", nemotron_h_config, jamba_tensor),
    "qwen35": GGUFArch("Qwen3_5ForCausalLM", qwen35_config, qwen35_tensor),
    "qwen35moe": GGUFArch("Qwen3_5MoeForCausalLM", qwen35_config, qwen35_tensor),
    "qwen3next": GGUFArch("Qwen3NextForCausalLM", qwen35_config, qwen35_tensor),
}
