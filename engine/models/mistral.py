"""Mistral: Llama without biases; ``sliding_window`` applies to every layer (the
memory gives those layers a sliding-window cache, see memory/attention/sliding_kv.py)."""

from engine.models.base import DecoderLM


class MistralForCausalLM(DecoderLM):
    qkv_bias = False
