"""Llama (and the many checkpoints that reuse its architecture)."""

from engine.models.base import DecoderLM


class LlamaForCausalLM(DecoderLM):
    """q/k/v/o bias follow the config's ``attention_bias``; MLP bias ``mlp_bias``."""
