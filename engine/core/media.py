"""Images in a sequence: which prompt positions an image's tokens hold, its content hash,
and its encoder output once computed.

A prompt holds an image as ``n_tokens`` placeholder tokens (the model's image token id)
at positions ``start .. start + n_tokens - 1``; the model's input embeddings there are
the image's encoded tokens instead. The positions of one image are computed in one
forward (the planner never splits them: engine/core/planner.py) and see each other both
ways (``visible``: the last position of their image), as Gemma 3 attends. The digest
(sha256 of the preprocessed pixels) names the image wherever prompts are compared."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class MediaItem:
    start: int  # position of the first placeholder
    n_tokens: int
    digest: str
    pixels: torch.Tensor | None  # [C, H, W] preprocessed, until encoded
    features: torch.Tensor | None = None  # [n_tokens, hidden] once encoded
    stage: int = 0  # encoder stages done (engine/core/media_encoder.py)
    state: torch.Tensor | None = None  # the encoder's output after ``stage`` stages, while under way
    grid: tuple[int, int] | None = None  # (rows, cols) of its tokens, where positions follow them (M-RoPE)

    @classmethod
    def image(cls, start: int, n_tokens: int, pixels: torch.Tensor, grid: tuple[int, int] | None = None) -> MediaItem:
        digest = hashlib.sha256(pixels.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()
        if grid is not None:  # the same pixels in another grid are another image
            digest = hashlib.sha256(f"{digest}:{grid}".encode()).hexdigest()
        return cls(start, n_tokens, digest, pixels, grid=grid)

    @property
    def end(self) -> int:
        """One past the last placeholder position."""
        return self.start + self.n_tokens


def check_media(model, model_config, prompt_ids: list[int], media: list[MediaItem]) -> None:
    """ValueError unless the model encodes images and each item covers its placeholders
    (in order, inside the prompt; the model's fixed count where it has one)."""
    spec = model_config.media
    if spec is None or not hasattr(model, "encode_images"):
        raise ValueError(f"this model ({model_config.architecture}) takes no images")
    end = 0
    for m in media:
        fixed = spec.tokens_per_image  # 0: the count follows the image (checked when encoded)
        if m.start < end or m.end > len(prompt_ids) or (fixed and m.n_tokens != fixed) or m.n_tokens < 1:
            raise ValueError(f"an image at {m.start} does not fit its prompt ({m.n_tokens} positions)")
        if any(t != spec.image_token_id for t in prompt_ids[m.start : m.end]):
            raise ValueError(f"the prompt holds no image placeholders at {m.start}..{m.end - 1}")
        end = m.end


def split_point(items: list[MediaItem], start: int, n: int) -> int:
    """Tokens of a chunk [start, start + n) to compute so that no image is cut and none
    runs before it is encoded: the chunk ends before an image it would cut or that has
    no features yet (0: the chunk would start with it), unless an encoded image starts
    the chunk (it then runs whole, past the budget)."""
    for m in items:
        if start < m.end and m.start < start + n and m.features is None:
            return max(0, m.start - start)
        if start < m.end and m.start < start + n < m.end:  # the chunk's end falls inside m
            return m.end - start if m.start <= start else m.start - start
    return n


def mrope_positions(media: list[MediaItem], start: int, n: int) -> torch.Tensor:
    """Rotary positions [3, n] (time, height, width) of a sequence's tokens start ..
    start + n - 1 (Qwen2-VL's M-RoPE): text at its index less what the images before it
    saved (an image of rows x cols tokens advances the position by max(rows, cols), not
    by its count); an image's token at (r, c) of its grid has (b, b + r, b + c), b the
    position of its first token."""
    index = torch.arange(start, start + n)  # [n]
    pos = index.expand(3, n).clone()  # [3, n]
    saved = 0  # positions the images so far did not take
    for m in sorted(media, key=lambda m: m.start):
        rows, cols = m.grid if m.grid is not None else (1, m.n_tokens)
        base = m.start - saved
        inside = (index >= m.start) & (index < m.end)  # [n]
        j = index[inside] - m.start
        pos[0, inside] = base
        pos[1, inside] = base + j // cols
        pos[2, inside] = base + j % cols
        saved += m.n_tokens - max(rows, cols)
        pos[:, index >= m.end] -= m.n_tokens - max(rows, cols)
    return pos


KEY_MIN = -(16**15)  # the lowest key an image's placeholders get (slot files and disk entries may hold keys)


def media_keys(tokens: list[int], media: list[MediaItem]) -> list[int]:
    """``tokens`` as prompts are compared (prefix reuse, the prompt cache, shared blocks):
    each image's placeholders replaced by a negative id drawn from its digest, so two
    prompts share a prefix through an image only when it is the same image. Without
    media: ``tokens`` itself."""
    if not media:
        return tokens
    keys = list(tokens)
    for m in media:
        keys[m.start : min(m.end, len(keys))] = [-1 - int(m.digest[:15], 16)] * (min(m.end, len(keys)) - m.start)
    return keys
