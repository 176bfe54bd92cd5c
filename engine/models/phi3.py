"""Phi-3 and Phi-4 (``Phi3ForCausalLM``, issue 53): Llama with q/k/v and gate/up stored
fused (``qkv_proj``, ``gate_up_proj``: the layer's own fused projections, loaded whole),
partial rotary (``partial_rotary_factor``: Phi-4-mini's 0.75; rotate-half over the first
part of each head) and LongRoPE (``rope_type: longrope``, per-frequency short and long
factors and an attention factor: engine/models/rope.py). As transformers rotates: a row
turns by the long factors when its position is past the original context or its
sequence's prompt is longer than it (the runner marks those rows), by the short ones
otherwise; a sliding window where the config gives one, on every layer."""

from engine.models.base import DecoderLM


class Phi3ForCausalLM(DecoderLM):
    pass
