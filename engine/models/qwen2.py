"""Qwen2: Llama with a bias on the q, k and v projections (none on o)."""

from engine.models.base import DecoderLM


class Qwen2ForCausalLM(DecoderLM):
    qkv_bias = True
