"""Qwen2.5-VL (transformers' ``Qwen2_5_VLForConditionalGeneration``): the Qwen2 language
model with multimodal rotary positions (M-RoPE) and Qwen's windowed vision transformer
(engine/models/vision/qwen_vit.py). An image takes one token per 2 x 2 block of its
14-pixel patches, so its token count follows its size (engine/text/image_prompts.py).

M-RoPE: every position has three coordinates (time, height, width), and the rotary
frequencies are split into ``mrope_section`` parts, part k rotated by coordinate k % 3.
Text has all three equal; an image's token at block (r, c) of its grid has
(b, b + r, b + c), b the position its first token would have had as text, and the text
after the image continues from b + max(rows, cols) (engine/core/media.py's
``mrope_positions``). Positions in the cache stay the tokens' indices; only the
rotation uses these.

Checkpoint names: ``model.*`` (language model), ``visual.*``, ``lm_head.*`` as saved;
transformers 5's ``model.language_model.*`` and ``model.visual.*`` too."""

from __future__ import annotations

import torch

from engine.models.config import ModelConfig
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.vision import ImageModel
from engine.models.vision.qwen_vit import QwenVision, QwenVisionConfig
from memory import ForwardView


def _sections(raw: dict) -> list[int]:
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("mrope_section"):
            return [int(s) for s in params["mrope_section"]]
    return [16, 24, 24]


class Qwen2_5_VLForConditionalGeneration(ImageModel, Qwen2ForCausalLM):
    mrope = True  # the runner gives rotary positions [3, T] (engine/core/media.py)
    media_prefixes = ("visual.",)  # what a --mmproj file holds
    checkpoint_prefixes = (("model.language_model.", "model."), ("model.visual.", "visual."))

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.media is None:
            raise ValueError("Qwen2_5_VLForConditionalGeneration needs a vision_config")
        self.visual = QwenVision(QwenVisionConfig.from_hf(cfg.media.vision))
        self.sections = _sections(cfg.raw)
        if 2 * sum(self.sections) != cfg.head_dim:
            raise ValueError(f"mrope_section {self.sections} does not cover half the head ({cfg.head_dim})")

    @property
    def encoder(self) -> QwenVision:
        return self.visual

    def encode_end(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output [N, R, C, 4, D] -> image tokens [N, R * C, hidden]."""
        return self.visual.merger(x)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        view: ForwardView,
        rows: torch.Tensor,
        media=None,
        rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As DecoderLM's, the rotation by ``rope_positions`` [3, T] where given (a
        sequence with images), else by ``positions`` (text alone: the three coordinates
        are equal)."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        if rope_positions is None:
            cos, sin = self.rotary.cos_sin(positions)  # [T, 1, D]
        else:
            cos, sin = self.rotary.cos_sin_sections(rope_positions, self.sections)  # [T, 1, D]
        for layer in self.model.layers:
            x = layer(x, cos, sin, view)
        return self.model.norm(x[rows])
