"""SigLIP's vision transformer (Gemma 3's and SmolVLM's image encoder), as transformers'
``SiglipVisionModel`` without its pooling head: patch embedding (a strided conv),
learned position embeddings, pre-norm encoder layers with bidirectional attention and
a tanh-GELU MLP, a final LayerNorm. Module names follow the checkpoints'
(``embeddings.patch_embedding``, ``encoder.layers.N.self_attn.q_proj``, ...).

SmolVLM / Idefics3 (``navit=True``) look their position embeddings up by bucketed
fractional coordinates (NaViT's), as transformers computes them: for some grid sides
float rounding repeats a row (side 19: ..., 11, 11, 13, ...), which the ids keep."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import embedding


@dataclass(frozen=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    image_size: int
    patch_size: int
    n_channels: int = 3
    eps: float = 1e-6

    @classmethod
    def from_hf(cls, raw: dict) -> VisionConfig:
        """transformers' ``vision_config`` (SiglipVisionConfig's defaults where absent)."""
        return cls(
            hidden_size=raw.get("hidden_size", 768),
            intermediate_size=raw.get("intermediate_size", 3072),
            n_layers=raw.get("num_hidden_layers", 12),
            n_heads=raw.get("num_attention_heads", 12),
            image_size=raw.get("image_size", 224),
            patch_size=raw.get("patch_size", 16),
            n_channels=raw.get("num_channels", 3),
            eps=raw.get("layer_norm_eps", 1e-6),
        )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


def navit_positions(rows: int, cols: int, side: int, device: torch.device) -> torch.Tensor:
    """Position-embedding ids [rows * cols] of a full grid of patches, NaViT's buckets of
    fractional coordinates over ``side`` x ``side`` learned positions (transformers'
    arithmetic in float32, so the same ids)."""
    bounds = torch.arange(1 / side, 1.0, 1 / side, device=device)  # [side - 1]

    def buckets(n: int) -> torch.Tensor:
        step = 1.0 / torch.tensor([n], device=device)  # float32, as 1.0 / a count tensor
        coords = torch.arange(n, device=device, dtype=torch.float32) * step
        return torch.bucketize(coords.clamp(max=1.0 - 1e-6), bounds, right=True)  # [n]

    return (buckets(rows)[:, None] * side + buckets(cols)[None, :]).reshape(-1)  # [rows * cols]


class _Embeddings(nn.Module):
    def __init__(self, c: VisionConfig, navit: bool):
        super().__init__()
        self.side, self.navit = c.patches_per_side, navit
        self.patch_embedding = nn.Conv2d(c.n_channels, c.hidden_size, c.patch_size, stride=c.patch_size)
        self.position_embedding = embedding(c.patches_per_side**2, c.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C, H, W] -> [N, P, hidden] (P = patches, row-major)."""
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))  # [N, hidden, H/p, W/p]
        if self.navit:
            ids = navit_positions(patches.shape[2], patches.shape[3], self.side, patches.device)  # [P]
            return patches.flatten(2).transpose(1, 2) + self.position_embedding(ids)  # [N, P, hidden]
        return patches.flatten(2).transpose(1, 2) + self.position_embedding.weight  # [N, P, hidden]


class _Attention(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.q_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.k_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.v_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.out_proj = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, p, d = x.shape
        heads = lambda t: t.view(n, p, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731  [N, H, P, D/H]
        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(n, p, d))  # [N, P, hidden]


class _MLP(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class _Layer(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.hidden_size, eps=c.eps)
        self.self_attn = _Attention(c)
        self.layer_norm2 = nn.LayerNorm(c.hidden_size, eps=c.eps)
        self.mlp = _MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipVision(nn.Module):
    def __init__(self, c: VisionConfig, navit: bool = False):
        super().__init__()
        self.config = c
        self.embeddings = _Embeddings(c, navit)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(_Layer(c) for _ in range(c.n_layers))
        self.post_layernorm = nn.LayerNorm(c.hidden_size, eps=c.eps)

    @property
    def n_stages(self) -> int:
        """The encoder in resumable pieces: the embeddings, then each layer."""
        return 1 + len(self.encoder.layers)

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage ``i``: pixels [N, C, H, W] -> [N, P, hidden] (i = 0), or one layer."""
        return self.embeddings(x) if i == 0 else self.encoder.layers[i - 1](x)

    def stage_flops(self, x: torch.Tensor) -> int:
        """About the FLOPs of one layer (the costliest stage) over one image whose state is
        ``x`` [N, P, hidden]: the projections and MLP, and attention's two products."""
        c, n_patches = self.config, x.shape[1]
        return (
            2 * n_patches * (4 * c.hidden_size**2 + 2 * c.hidden_size * c.intermediate_size)
            + 4 * n_patches**2 * c.hidden_size
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C, image_size, image_size] -> last hidden states [N, P, hidden]."""
        x = pixels
        for i in range(self.n_stages):
            x = self.stage(i, x)
        return self.post_layernorm(x)
