"""Qwen3: Llama with per-head RMSNorm on queries and keys before rotation."""

from engine.models.base import DecoderLM


class Qwen3ForCausalLM(DecoderLM):
    qk_norm = True
