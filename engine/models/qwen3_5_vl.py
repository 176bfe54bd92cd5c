"""Qwen3.5 and Qwen3.5-MoE with images (transformers' ``Qwen3_5ForConditionalGeneration``
and ``Qwen3_5MoeForConditionalGeneration``, the published folders' classes): the
language model of qwen3_5.py / qwen3_next.py, under ``model.language_model.``, and the
vision transformer of engine/models/vision/qwen3_vit.py under ``model.visual.``. An
image takes one token per 2 x 2 block of its 16-pixel patches
(engine/text/image_prompts.py's QwenImages), at the M-RoPE positions of Qwen2.5-VL
(engine/core/media.py's ``mrope_positions``), rotated by interleaved sections
(``Rotary.cos_sin_interleaved``). The multi-token-prediction head is skipped. A folder
without a ``vision_config``, or a GGUF without its projector, serves text alone."""

from __future__ import annotations

from engine.models.config import ModelConfig
from engine.models.qwen3_5 import Qwen3_5ForCausalLM
from engine.models.qwen3_next import Qwen3_5MoeForCausalLM
from engine.models.vision import ImageModel
from engine.models.vision.qwen3_vit import Qwen3Vision, Qwen3VisionConfig


class Qwen3_5Images(ImageModel):
    """The vision tower beside a Qwen3.5 language model (mixed in before it)."""

    mrope = True  # the runner gives rotary positions [3, T] for sequences with images
    media_prefixes = ("visual.",)  # what a --mmproj file holds
    checkpoint_prefixes = (("model.language_model.", "model."), ("model.visual.", "visual."))
    skipped_prefixes = ("mtp.",)  # the multi-token-prediction head published with the model

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.media is None:  # text alone: the tower's tensors, if any, are not read
            self.skipped_prefixes = ("visual.", "mtp.")
        else:
            self.visual = Qwen3Vision(Qwen3VisionConfig.from_hf(cfg.media.vision))

    @property
    def encoder(self) -> Qwen3Vision:
        return self.visual

    def encode_end(self, x):
        """The last block's output [N, R, C, 4, D] -> image tokens [N, R * C, hidden]."""
        return self.visual.merger(x)


class Qwen3_5ForConditionalGeneration(Qwen3_5Images, Qwen3_5ForCausalLM):
    pass


class Qwen3_5MoeForConditionalGeneration(Qwen3_5Images, Qwen3_5MoeForCausalLM):
    pass
