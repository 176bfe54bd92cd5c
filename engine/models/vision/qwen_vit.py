"""Qwen2.5-VL's vision transformer (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``):
14-pixel patches (two frames deep: an image is its own frame twice) embedded by one
matrix, 2-D rotary positions (height and width, each over half the head's rotary
frequencies), pre-norm blocks (RMSNorm, attention with a bias on qkv, a gated SiLU MLP
with biases) that attend within windows of ``window_size`` pixels except the
``fullatt_block_indexes`` blocks, which see the whole image; then the merger: RMSNorm
and a GELU MLP over each 2 x 2 block of patches, one language-model token per block.

An image arrives as transformers' processor lays its patches out, block-major:
[rows / 2, cols / 2, 4, C * 2 * 14 * 14] (engine/text/image_prompts.py), and the encoder's
state keeps that grid ([N, rows / 2, cols / 2, 4, hidden]) between stages, so each stage
knows the image's shape. Attention runs in that order with a window mask; transformers
permutes the patches window by window and splits the sequence instead: the same sums,
in another order (equal to float rounding). Module names follow the checkpoints'
(``patch_embed.proj``, ``blocks.N.attn.qkv``, ``merger.mlp.0``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class QwenVisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    n_heads: int
    out_hidden_size: int
    patch_size: int = 14
    merge: int = 2
    temporal_patch_size: int = 2
    window_size: int = 112
    full_attention: tuple[int, ...] = (7, 15, 23, 31)
    in_channels: int = 3
    theta: float = 10000.0

    @classmethod
    def from_hf(cls, raw: dict) -> QwenVisionConfig:
        rope = raw.get("rope_parameters") or {}
        return cls(
            depth=raw.get("depth", 32),
            hidden_size=raw.get("hidden_size", 1280),
            intermediate_size=raw.get("intermediate_size", 3420),
            n_heads=raw.get("num_heads", 16),
            out_hidden_size=raw.get("out_hidden_size", 3584),
            patch_size=raw.get("patch_size", 14),
            merge=raw.get("spatial_merge_size", 2),
            temporal_patch_size=raw.get("temporal_patch_size", 2),
            window_size=raw.get("window_size", 112),
            full_attention=tuple(raw.get("fullatt_block_indexes", (7, 15, 23, 31))),
            in_channels=raw.get("in_channels", 3),
            theta=float(rope.get("rope_theta", 10000.0)),
        )


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class _Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight)


class _Attention(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [N, P, D]; cos, sin [P, Dh]; mask [P, P] bool (None: all) -> [N, P, D]."""
        n, p, d = x.shape
        q, k, v = self.qkv(x).view(n, p, 3, self.n_heads, d // self.n_heads).unbind(2)  # [N, P, H, Dh] each

        def rotated(t: torch.Tensor) -> torch.Tensor:
            t32, half = t.float(), t.shape[-1] // 2
            turned = torch.cat((-t32[..., half:], t32[..., :half]), dim=-1)
            return (t32 * cos[:, None] + turned * sin[:, None]).to(t.dtype).transpose(1, 2)  # [N, H, P, Dh]

        out = F.scaled_dot_product_attention(rotated(q), rotated(k), v.transpose(1, 2), attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(n, p, d))


class _MLP(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.norm1, self.norm2 = _Norm(c.hidden_size), _Norm(c.hidden_size)
        self.attn = _Attention(c)
        self.mlp = _MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        width = c.hidden_size * c.merge * c.merge
        self.ln_q = _Norm(c.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, c.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, R, C, m*m, D] -> [N, R * C, out] (one token per block of m x m patches)."""
        n, rows, cols = x.shape[:3]
        return self.mlp(self.ln_q(x).reshape(n, rows * cols, -1))


def patch_rows_cols(rows: int, cols: int, merge: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The patch row and column [P] each of a grid of rows x cols merged blocks, in the
    patches' block-major order."""
    m = merge
    r, c, i, j = torch.meshgrid(*(torch.arange(n, device=device) for n in (rows, cols, m, m)), indexing="ij")
    return (r * m + i).reshape(-1), (c * m + j).reshape(-1)


def grid_rope(
    rows: int, cols: int, merge: int, dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen's 2-D vision rotary: cos, sin [P, 2 * dim] for a grid of rows x cols merged
    blocks, patches block-major; height and width each over ``dim`` of the head."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    h, w = patch_rows_cols(rows, cols, merge, device)  # [P] each
    freqs = torch.cat((h[:, None] * inv_freq, w[:, None] * inv_freq), dim=-1)  # [P, dim]
    freqs = torch.cat((freqs, freqs), dim=-1)  # [P, 2 * dim]
    return freqs.cos(), freqs.sin()


class QwenVision(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.config = c
        self.patch_embed = nn.Module()
        k = c.patch_size
        self.patch_embed.proj = nn.Conv3d(
            c.in_channels, c.hidden_size, (c.temporal_patch_size, k, k), (c.temporal_patch_size, k, k), bias=False
        )
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.depth))
        self.merger = _Merger(c)
        head = c.hidden_size // c.n_heads
        self.rotary_dim = head // 2  # each of height and width rotates over half the head's frequencies

    @property
    def n_stages(self) -> int:
        """The patch embedding, then each block."""
        return 1 + len(self.blocks)

    def _rope(self, rows: int, cols: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return grid_rope(rows, cols, self.config.merge, self.rotary_dim, self.config.theta, device)

    def _window_mask(self, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        """[P, P] bool: patches in the same window (of window_size pixels) see each other."""
        c = self.config
        side = c.window_size // c.merge // c.patch_size  # merged blocks a window holds on a side
        r, col = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
        window = ((r // side) * cols + col // side).reshape(-1).repeat_interleave(c.merge * c.merge)  # [P]
        return window[:, None] == window[None, :]

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage 0: patches [N, R, C, m*m, K] -> [N, R, C, m*m, D]; stage i: block i - 1."""
        if i == 0:
            w = self.patch_embed.proj.weight  # [D, C, T, k, k]
            return x.to(w.dtype) @ w.reshape(w.shape[0], -1).T
        n, rows, cols, unit, d = x.shape
        cos, sin = self._rope(rows, cols, x.device)
        mask = None if i - 1 in self.config.full_attention else self._window_mask(rows, cols, x.device)
        out = self.blocks[i - 1](x.reshape(n, -1, d), cos, sin, mask)
        return out.reshape(n, rows, cols, unit, d)

    def stage_flops(self, x: torch.Tensor) -> int:
        """About the FLOPs of one block over one image whose state is ``x``."""
        c = self.config
        p = x[0].numel() // x.shape[-1]
        return 2 * p * (4 * c.hidden_size**2 + 3 * c.hidden_size * c.intermediate_size) + 4 * p * p * c.hidden_size
