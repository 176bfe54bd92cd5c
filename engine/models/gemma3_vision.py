"""Gemma 3 with images (transformers' ``Gemma3ForConditionalGeneration``): the Gemma 3
language model, SigLIP's vision transformer (engine/models/vision/siglip.py) and the
projector: the patch grid average-pooled to ``mm_tokens_per_image`` tokens, Gemma's
RMSNorm (1 + w), a matrix into the language model's width. The projected tokens replace
the embeddings of the image's placeholder tokens (after the embedding scale: they are
not scaled), and the tokens of one image attend to each other both ways (the engine
marks them: engine/core/media.py).

Checkpoint names come in two layouts, both mapped onto this module's:
transformers 4 / as saved (``language_model.model.*``, ``vision_tower.vision_model.*``,
``multi_modal_projector.*``) and transformers 5's ``model.language_model.*``,
``model.vision_tower.*``. SigLIP's pooling head (unused by Gemma 3) is skipped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import ModelConfig
from engine.models.gemma import Gemma3ForCausalLM, GemmaRMSNorm
from engine.models.vision import ImageModel
from engine.models.vision.siglip import SiglipVision, VisionConfig


class Gemma3Projector(nn.Module):
    def __init__(self, vision: VisionConfig, text_hidden: int, tokens_per_image: int):
        super().__init__()
        self.mm_input_projection_weight = nn.Parameter(torch.empty(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.eps)
        self.side = vision.patches_per_side
        self.kernel = self.side // int(tokens_per_image**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """SigLIP's last hidden states [N, P, Dv] -> image tokens [N, tokens_per_image, D]."""
        n, _, dim = x.shape
        grid = x.transpose(1, 2).reshape(n, dim, self.side, self.side)  # [N, Dv, side, side]
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)  # [N, T, Dv]
        return (self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight).type_as(x)  # [N, T, D]


class Gemma3ForConditionalGeneration(ImageModel, Gemma3ForCausalLM):
    media_bidirectional = True
    media_prefixes = ("vision_tower.", "multi_modal_projector.")  # what a --mmproj file holds
    checkpoint_prefixes = (
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.vision_tower.vision_model.", "vision_tower."),
        ("model.vision_tower.", "vision_tower."),
        ("vision_tower.vision_model.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )
    skipped_prefixes = ("vision_tower.head.",)  # SigLIP's attention-pooling head

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.media is None:
            raise ValueError("Gemma3ForConditionalGeneration needs a vision_config")
        vision = VisionConfig.from_hf(cfg.media.vision)
        self.vision_tower = SiglipVision(vision)
        self.multi_modal_projector = Gemma3Projector(vision, cfg.hidden_size, cfg.media.tokens_per_image)

    @property
    def encoder(self) -> SiglipVision:
        return self.vision_tower

    def encode_end(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's last stage's output [N, P, Dv] -> image tokens [N, T, hidden]."""
        return self.multi_modal_projector(self.vision_tower.post_layernorm(x))
