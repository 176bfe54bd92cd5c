"""Qwen3.5's vision transformer (transformers' ``Qwen3_5VisionModel``, Qwen3-VL's without
its deepstack taps): 16-pixel patches (two frames deep, as Qwen2.5-VL's) embedded by one
matrix with a bias, plus a learned position table of ``num_position_embeddings`` (a
square grid) resampled bilinearly (corners aligned) to the image's patch grid; the 2-D
rotary of Qwen2.5-VL (qwen_vit.py's ``grid_rope``); pre-norm blocks (LayerNorm,
attention over the whole image with a bias on qkv, a GELU MLP); then the merger:
LayerNorm per patch and a GELU MLP over each 2 x 2 block, one language-model token
per block.

The state between stages is qwen_vit.py's grid, [N, rows / 2, cols / 2, 4, hidden], so
each stage knows the image's shape. Module names follow the checkpoints'
(``patch_embed.proj``, ``pos_embed``, ``blocks.N.mlp.linear_fc1``, ``merger.norm``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.vision.qwen_vit import _Attention, grid_rope, patch_rows_cols


@dataclass(frozen=True)
class Qwen3VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    n_heads: int
    out_hidden_size: int
    n_positions: int = 2304  # the learned table: a square grid of this many
    patch_size: int = 16
    merge: int = 2
    temporal_patch_size: int = 2
    in_channels: int = 3
    act: str = "gelu_pytorch_tanh"
    theta: float = 10000.0
    eps: float = 1e-6

    @classmethod
    def from_hf(cls, raw: dict) -> Qwen3VisionConfig:
        rope = raw.get("rope_parameters") or {}
        return cls(
            depth=int(raw.get("depth", 27)),
            hidden_size=int(raw.get("hidden_size", 1152)),
            intermediate_size=int(raw.get("intermediate_size", 4304)),
            n_heads=int(raw.get("num_heads", 16)),
            out_hidden_size=int(raw.get("out_hidden_size", 3584)),
            n_positions=int(raw.get("num_position_embeddings", 2304)),
            patch_size=int(raw.get("patch_size", 16)),
            merge=int(raw.get("spatial_merge_size", 2)),
            temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            in_channels=int(raw.get("in_channels", 3)),
            act=str(raw.get("hidden_act", "gelu_pytorch_tanh")),
            theta=float(rope.get("rope_theta", 10000.0)),
            eps=float(raw.get("layer_norm_eps", 1e-6)),
        )


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (corners aligned) of target positions ``index`` [P] on an axis of
    ``size`` into a table side of ``side`` -> taps, weights [P, 2] (transformers' sums)."""
    src = index.float() * (side - 1) / max(size - 1, 1)  # [P]
    floor = src.floor()
    offsets = torch.arange(2, device=index.device)  # floor, floor + 1
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)  # [P, 2]
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)  # [P, 2]
    return taps, weights


class _MLP(nn.Module):
    def __init__(self, c: Qwen3VisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.linear_fc2 = nn.Linear(c.intermediate_size, c.hidden_size)
        self.approximate = "tanh" if "tanh" in c.act else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class _Block(nn.Module):
    def __init__(self, c: Qwen3VisionConfig):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.hidden_size, eps=c.eps), nn.LayerNorm(c.hidden_size, eps=c.eps)
        self.attn = _Attention(c)
        self.mlp = _MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, None)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, c: Qwen3VisionConfig):
        super().__init__()
        width = c.hidden_size * c.merge * c.merge
        self.norm = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(width, width)
        self.linear_fc2 = nn.Linear(width, c.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, R, C, m*m, D] -> [N, R * C, out] (one token per block of m x m patches)."""
        n, rows, cols = x.shape[:3]
        h = self.norm(x).reshape(n, rows * cols, -1)  # [N, R * C, m*m*D]
        return self.linear_fc2(F.gelu(self.linear_fc1(h)))


class Qwen3Vision(nn.Module):
    def __init__(self, c: Qwen3VisionConfig):
        super().__init__()
        self.config = c
        self.patch_embed = nn.Module()
        k = c.patch_size
        self.patch_embed.proj = nn.Conv3d(
            c.in_channels, c.hidden_size, (c.temporal_patch_size, k, k), (c.temporal_patch_size, k, k)
        )
        self.pos_embed = nn.Embedding(c.n_positions, c.hidden_size)
        self.side = int(c.n_positions**0.5)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.depth))
        self.merger = _Merger(c)
        self.rotary_dim = c.hidden_size // c.n_heads // 2  # height and width each over half the head

    @property
    def n_stages(self) -> int:
        """The patch embedding, then each block."""
        return 1 + len(self.blocks)

    def positions(self, rows: int, cols: int) -> torch.Tensor:
        """The learned table resampled to a grid of rows x cols merged blocks -> [P, D],
        patches block-major."""
        m, table = self.config.merge, self.pos_embed.weight  # [side * side, D]
        h, w = patch_rows_cols(rows, cols, m, table.device)  # [P] each
        h_taps, h_weights = _axis_taps(h, rows * m, self.side)  # [P, 2] each
        w_taps, w_weights = _axis_taps(w, cols * m, self.side)
        index = (h_taps[:, :, None] * self.side + w_taps[:, None, :]).reshape(-1, 4)  # [P, 4]
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)  # [P, 4]
        return (table[index] * weights[:, :, None].to(table.dtype)).sum(1)  # [P, D]

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage 0: patches [N, R, C, m*m, K] -> [N, R, C, m*m, D] (embedded, positions
        added); stage i: block i - 1."""
        if i == 0:
            w, b = self.patch_embed.proj.weight, self.patch_embed.proj.bias  # [D, C, T, k, k], [D]
            n, rows, cols, unit, _ = x.shape
            out = x.to(w.dtype) @ w.reshape(w.shape[0], -1).T + b  # [N, R, C, m*m, D]
            return out + self.positions(rows, cols).view(rows, cols, unit, -1)
        n, rows, cols, unit, d = x.shape
        cos, sin = grid_rope(rows, cols, self.config.merge, self.rotary_dim, self.config.theta, x.device)
        out = self.blocks[i - 1](x.reshape(n, -1, d), cos, sin)
        return out.reshape(n, rows, cols, unit, d)

    def stage_flops(self, x: torch.Tensor) -> int:
        """About the FLOPs of one block over one image whose state is ``x``."""
        c = self.config
        p = x[0].numel() // x.shape[-1]
        return 2 * p * (4 * c.hidden_size**2 + 2 * c.hidden_size * c.intermediate_size) + 4 * p * p * c.hidden_size
