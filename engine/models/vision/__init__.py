"""Vision encoders and their projectors into a language model's embedding space."""

from __future__ import annotations

import torch


class ImageModel:
    """A language model that takes images (mixed in before its DecoderLM class). It
    provides ``encoder`` (``n_stages``, ``stage(i, x)``, ``stage_flops(x)``: the pieces
    engine/core/media_encoder.py runs between steps) and ``encode_end`` (the encoder's
    last output -> image tokens); ``encode_images`` runs them all at once."""

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Preprocessed frames of one size [N, ...] -> image tokens [N, n_tokens, hidden]."""
        x = pixels
        for i in range(self.encoder.n_stages):
            x = self.encoder.stage(i, x)
        return self.encode_end(x)
