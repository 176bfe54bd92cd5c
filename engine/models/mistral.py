"""Mistral: Llama without biases. Its sliding window is not applied yet (full
attention); sequences longer than the window diverge from the reference."""

from engine.models.base import DecoderLM
from engine.models.registry import register


@register("MistralForCausalLM")
class MistralForCausalLM(DecoderLM):
    qkv_bias = False
