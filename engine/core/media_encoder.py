"""The vision encoder between steps, in bounded pieces: before each step it advances the
images that prefilling sequences reach next, stage by stage (the encoder's embeddings,
then each layer, then its projector), until about one prefill chunk's worth of work is
spent. A big image therefore never holds the other slots' decode tokens back longer
than a prefill chunk does: it is encoded over as many steps as it needs, and its
sequence computes the text before it meanwhile (the planner stops a chunk before an
image that has no features yet: engine/core/media.py's ``split_point``).

Frames of one sequence at the same stage go through the encoder as one batch (a tiled
image's tiles). Work is measured in estimated FLOPs: a stage costs about one encoder
layer over one frame's patches (the model's ``encoder.stage_flops``); one prefill chunk
about ``2 x max_batch_tokens x`` the language model's layer parameters. At least one
stage runs per step, so an image always gets there."""

from __future__ import annotations

import time

import torch

from engine.core.media import MediaItem
from engine.core.sequence import Sequence


class MediaEncoder:
    def __init__(self, model, device: torch.device, chunk_tokens: int):
        self.model, self.device = model, device
        self.dtype = next(model.parameters()).dtype
        layers = getattr(getattr(model, "model", None), "layers", [])
        self.chunk_flops = 2 * chunk_tokens * sum(p.numel() for layer in layers for p in layer.parameters())
        self.n_images_encoded, self.encode_seconds = 0, 0.0  # the encoder's work (/metrics)

    def pending(self, seq: Sequence) -> list[MediaItem]:
        """The frames the sequence's prompt still needs, first the one it reaches next."""
        if not seq.media or seq.n_pending <= 1:
            return []
        return [m for m in seq.media if m.features is None and m.end > seq.n_computed]

    @torch.inference_mode()
    def advance(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """Spend about one prefill chunk of encoder work on the sequences' pending frames,
        first come first served; returns the sequences whose encoding raised (their
        frames are left as they were before this call's stage)."""
        budget, failed = self.chunk_flops, []
        for seq in running:
            todo = self.pending(seq)
            while todo and (budget > 0 or budget == self.chunk_flops):
                group = [m for m in todo if m.stage == todo[0].stage and m.pixels.shape == todo[0].pixels.shape]
                try:
                    budget -= self._stage(group)
                except Exception as exc:
                    failed.append((seq, exc))
                    break
                todo = self.pending(seq)
            if budget <= 0:
                break
        return failed

    def _stage(self, group: list[MediaItem]) -> int:
        """One encoder stage for frames at the same stage, batched; the last stage sets
        their features. Returns its estimated FLOPs."""
        t0 = time.perf_counter()
        encoder, i = self.model.encoder, group[0].stage
        if i == 0:
            x = torch.stack([m.pixels for m in group]).to(self.device, self.dtype)  # [N, C, H, W] (or patches)
        else:
            x = torch.stack([m.state for m in group])  # [N, P, Dv] (or [N, *grid, Dv])
        out = encoder.stage(i, x)  # [N, P, Dv] (or the encoder's grid of patches)
        flops = len(group) * encoder.stage_flops(out)
        done = i + 1 == encoder.n_stages
        if done:
            out = self.model.encode_end(out)  # [N, n_tokens, hidden]
            for m, t in zip(group, out):
                if t.shape[0] != m.n_tokens:
                    raise ValueError(f"the image encodes to {t.shape[0]} tokens, its placeholders are {m.n_tokens}")
        for m, t in zip(group, out):
            m.stage = i + 1
            if done:
                m.features, m.state, m.pixels = t, None, None
            else:
                m.state = t
        self.encode_seconds += time.perf_counter() - t0
        self.n_images_encoded += len(group) if done else 0
        return flops
