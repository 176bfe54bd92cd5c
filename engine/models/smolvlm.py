"""SmolVLM and Idefics3 (transformers' ``SmolVLMForConditionalGeneration`` and
``Idefics3ForConditionalGeneration``): a Llama language model, SigLIP's vision
transformer with NaViT position buckets (engine/models/vision/siglip.py) and the
connector: a pixel shuffle that folds each ``scale`` x ``scale`` block of patches into
one token ``scale**2`` times as wide, then one matrix into the language model's width.
Each frame of an image (its tiles and the whole image, engine/text/image_prompts.py)
becomes ``(side / scale)**2`` tokens that replace its placeholders' embeddings; the
language model attends causally over them (no bidirectional image block).

Checkpoint names: ``model.text_model.*``, ``model.vision_model.*``,
``model.connector.modality_projection.proj.weight`` and ``lm_head.weight``, in both
transformers 4 and 5."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.vision import ImageModel
from engine.models.vision.siglip import SiglipVision, VisionConfig


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[N, P, D] patches of a square grid -> [N, P / scale**2, D * scale**2], each token a
    ``scale`` x ``scale`` block (transformers' order of the folded features)."""
    n, p, d = x.shape
    side = int(p**0.5)
    x = x.reshape(n, side, side // scale, d * scale).permute(0, 2, 1, 3)  # [N, side/s, side, D*s]
    x = x.reshape(n, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)  # [N, side/s, side/s, D*s*s]
    return x.reshape(n, p // (scale * scale), d * scale * scale)


class _Projection(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(width, hidden, bias=False)


class SmolVLMConnector(nn.Module):
    def __init__(self, vision: VisionConfig, text_hidden: int, scale: int):
        super().__init__()
        self.scale = scale
        self.modality_projection = _Projection(vision.hidden_size * scale * scale, text_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Vision hidden states [N, P, Dv] -> frame tokens [N, P / scale**2, hidden]."""
        return self.modality_projection.proj(pixel_shuffle(x, self.scale))


class SmolVLMForConditionalGeneration(ImageModel, LlamaForCausalLM):
    media_bidirectional = False  # causal over image tokens, as transformers' SmolVLM
    media_prefixes = ("vision_model.", "connector.")  # what a --mmproj file holds
    checkpoint_prefixes = (
        ("model.text_model.", "model."),
        ("model.vision_model.", "vision_model."),
        ("model.connector.", "connector."),
    )

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.media is None:
            raise ValueError(f"{type(self).__name__} needs a vision_config")
        vision = VisionConfig.from_hf(cfg.media.vision)
        self.vision_model = SiglipVision(vision, navit=True)
        scale = cfg.media.vision.get("scale_factor", cfg.raw.get("scale_factor", 2))  # a GGUF projector's / config's
        self.connector = SmolVLMConnector(vision, cfg.hidden_size, int(scale))

    @property
    def encoder(self) -> SiglipVision:
        return self.vision_model

    def encode_end(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's last stage's output [N, P, Dv] -> frame tokens [N, T, hidden]."""
        return self.connector(self.vision_model.post_layernorm(x))


class Idefics3ForConditionalGeneration(SmolVLMForConditionalGeneration):
    """SmolVLM's first release (``model_type: idefics3``): the same modules and names."""
