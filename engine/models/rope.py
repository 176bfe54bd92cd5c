"""Rotary position embeddings (rotate-half layout) with the scaling types of Llama-family
configs: default, linear, llama3, yarn, proportional (Gemma 4). Frequencies follow transformers'
``modeling_rope_utils`` so logits match it."""

from __future__ import annotations

import math

import torch

from engine.kernels.rotary import fused_rotate
from engine.models.config import RopeConfig

# The frequencies are computed on the CPU whatever the default device: models are built
# on the meta device, where this arithmetic would go through torch's Python references
# (and import torch._dynamo, ~1.5 s of a process's start); init_buffers moves them.
CPU = torch.device("cpu")


def _default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=CPU).float() / dim))  # [dim/2]


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig, max_pos: int) -> torch.Tensor:
    old_ctx = rope.original_max_position_embeddings or max_pos
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: RopeConfig, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    old_ctx = rope.original_max_position_embeddings or max_pos
    attn = rope.attention_factor
    if attn is None:
        if rope.mscale and rope.mscale_all_dim:
            attn = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attn = _yarn_mscale(factor)

    def correction_dim(n_rot: float) -> float:
        return (dim * math.log(old_ctx / (n_rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=CPU) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device=CPU).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attn)


class Rotary(torch.nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int, max_position_embeddings: int):
        super().__init__()
        inv_freq = _default_inv_freq(rope.theta, head_dim)
        self.attention_scaling = 1.0
        if rope.rope_type == "linear":
            inv_freq = inv_freq / rope.factor
        elif rope.rope_type == "llama3":
            inv_freq = _llama3(inv_freq, rope, max_position_embeddings)
        elif rope.rope_type == "yarn":
            inv_freq, self.attention_scaling = _yarn(rope, head_dim, max_position_embeddings)
        elif rope.rope_type == "longrope":  # Phi-3: short factors up to the original context, long past it
            shape = torch.arange(0, head_dim, 2, dtype=torch.int64, device=CPU).float() / head_dim
            inv_freq = 1.0 / (torch.tensor(rope.short_factor, device=CPU) * rope.theta**shape)
            long = 1.0 / (torch.tensor(rope.long_factor, device=CPU) * rope.theta**shape)
            self.register_buffer("long_inv_freq", long, persistent=False)  # [D/2]
            old = rope.original_max_position_embeddings or max_position_embeddings
            self.switch_at = old  # a row past it (or of a prompt longer than it) turns by the long factors
            self.attention_scaling = rope.attention_factor or (
                math.sqrt(1 + math.log(rope.factor) / math.log(old)) if rope.factor > 1.0 else 1.0
            )
        elif rope.rope_type == "proportional":  # Gemma 4: the first angles rotate (over the whole head), the rest stay
            angles = int(rope.partial_rotary_factor * head_dim // 2)
            rotated = 1.0 / (rope.theta ** (torch.arange(0, 2 * angles, 2, device=CPU).float() / head_dim))
            inv_freq = torch.cat([rotated, torch.zeros(head_dim // 2 - angles, device=CPU)]) / rope.factor
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [D/2] float32

    def cos_sin(
        self, positions: torch.Tensor, scaled: bool = True, long: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, 1, D] float32 (broadcast over heads), for
        ``rotate``. ``sin`` carries rotate-half's sign: its first half is negated.
        ``long`` [T] bool (LongRoPE): the rows turned by the long factors."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        if long is not None and hasattr(self, "long_inv_freq"):
            freqs = torch.where(long[:, None], positions.float()[:, None] * self.long_inv_freq, freqs)
        scale = self.attention_scaling if scaled else 1.0
        cos, sin = freqs.cos() * scale, freqs.sin() * scale  # [T, D/2]
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]

    def cos_sin_sections(self, positions: torch.Tensor, sections: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rotary (Qwen2-VL's M-RoPE): positions [3, T] (time, height, width);
        the rotary frequencies split into ``sections`` (summing to D/2), section k taking
        its angles from stream k % 3 -> cos, sin [T, 1, D] as ``cos_sin``'s."""
        freqs = positions.float()[..., None] * self.inv_freq  # [3, T, D/2]
        freqs = torch.cat([part[k % 3] for k, part in enumerate(freqs.split(sections, dim=-1))], dim=-1)  # [T, D/2]
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]

    def cos_sin_interleaved(self, positions: torch.Tensor, sections: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Interleaved M-RoPE (Qwen3-VL, Qwen3.5): positions [3, T] (time, height, width);
        frequency j takes its angle from height where j % 3 == 1 and j < 3 * sections[1],
        from width where j % 3 == 2 and j < 3 * sections[2], from time otherwise -> cos,
        sin [T, 1, D] as ``cos_sin``'s."""
        j = torch.arange(self.inv_freq.shape[0], device=positions.device)  # [D/2]
        stream = torch.zeros_like(j)
        stream[(j % 3 == 1) & (j < 3 * sections[1])] = 1
        stream[(j % 3 == 2) & (j < 3 * sections[2])] = 2
        freqs = positions.float()[..., None] * self.inv_freq  # [3, T, D/2]
        freqs = freqs.gather(0, stream.expand(1, freqs.shape[1], -1))[0]  # [T, D/2]
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos, sin from ``Rotary.cos_sin`` -> rotated x (same dtype as x).

    Rotate-half (transformers' layout): x * cos + cat(-x2, x1) * sin. With the sign in
    ``sin``, cat(-x2, x1) * sin == roll(x) * signed sin exactly, in three ops."""
    fused = fused_rotate(x, cos, sin)  # one compiled call, where built
    if fused is not None:
        return fused
    out = torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)
    return out if out.dtype == x.dtype else out.to(x.dtype)
