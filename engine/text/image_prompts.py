"""What one image becomes in a prompt, per model family: its frames (the pixel tensors
the encoder takes, each ``tokens_per_image`` positions) and the text that stands for it,
whose runs of image tokens are the frames' placeholders, in order. The arithmetic
follows transformers' PIL image processors and its processors' prompt strings, so ids
and pixels equal theirs (tests/test_vision.py, tests/test_smolvlm.py).

- Gemma 3: one frame, the image squashed to the encoder's square; the text is a blank
  line, begin-of-image, the image tokens, end-of-image, a blank line.
- SmolVLM / Idefics3: the image resized so its longest edge is ``size.longest_edge``,
  then up to multiples of the encoder's side and cut into side x side tiles, row by row,
  plus the whole image squashed to one tile (an image no larger than a tile: that one
  frame only). Each tile's tokens follow ``<fake_token_around_image><row_R_col_C>``, a
  row ends with a newline, the whole image comes last after
  ``\\n<fake_token_around_image><global-img>`` and closes with the fake token."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.text.images import ImageSettings, image_text, normalized, pixels

LANCZOS = 1  # PIL's
MAX_SIDE = 4096  # transformers' absolute cap on a resized image's edge (Idefics3 / SmolVLM)


@dataclass(frozen=True)
class Gemma3Images:
    settings: ImageSettings
    text: str  # the text of one image

    def frames(self, image) -> tuple[list[torch.Tensor], str]:
        """An RGB PIL image -> ([C, H, W] frames, the text that stands for it)."""
        return [pixels(image, self.settings)], self.text


def _longest_edge(height: int, width: int, longest: int) -> tuple[int, int]:
    """The image scaled so its longest edge is ``longest`` (the other edge rounded up to
    even), then below MAX_SIDE: transformers' two resize rules, in their order."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / ratio)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * ratio)
    return max(height, 1), max(width, 1)


def _tile_multiple(height: int, width: int, side: int) -> tuple[int, int]:
    """Both edges up to multiples of ``side``, the short one from the aspect ratio first."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / side) * side
        height = math.ceil(int(width / ratio) / side) * side
    else:
        height = math.ceil(height / side) * side
        width = math.ceil(int(height * ratio) / side) * side
    return height, width


@dataclass(frozen=True)
class SmolVLMImages:
    tile: int  # the encoder's side in pixels (max_image_size.longest_edge)
    longest: int  # size.longest_edge
    split: bool  # do_image_splitting
    n_tokens: int  # image tokens per frame
    resample: int = LANCZOS
    rescale: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_token: str = "<image>"
    fake_token: str = "<fake_token_around_image>"
    global_token: str = "<global-img>"

    @classmethod
    def of_checkpoint(cls, folder: Path | None, vision: dict, n_tokens: int) -> SmolVLMImages:
        """The folder's preprocessor_config.json where it has one, else transformers' defaults
        for the encoder's side."""
        raw = {}
        path = folder / "preprocessor_config.json" if folder is not None and folder.is_dir() else None
        if path is not None and path.is_file():
            raw = json.loads(path.read_text(encoding="utf-8"))
        tile = int((raw.get("max_image_size") or {}).get("longest_edge", vision.get("image_size", 224)))
        normalize = raw.get("do_normalize", True)
        return cls(
            tile=tile,
            longest=int((raw.get("size") or {}).get("longest_edge", 4 * tile)),
            split=bool(raw.get("do_image_splitting", True)),
            n_tokens=n_tokens,
            resample=int(raw.get("resample", LANCZOS)),
            rescale=float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else 1.0,
            mean=tuple(raw.get("image_mean", (0.5, 0.5, 0.5))) if normalize else (0.0,) * 3,
            std=tuple(raw.get("image_std", (0.5, 0.5, 0.5))) if normalize else (1.0,) * 3,
        )

    def frames(self, image) -> tuple[list[torch.Tensor], str]:
        """An RGB PIL image -> ([3, tile, tile] frames: tiles row by row, then the whole
        image; the text that stands for it)."""
        side = self.tile
        height, width = _longest_edge(image.height, image.width, self.longest)
        image = image.resize((width, height), resample=self.resample)
        rows = cols = 0
        tiles = []
        if self.split:
            height, width = _tile_multiple(height, width, side)
            image = image.resize((width, height), resample=self.resample)
            if height > side or width > side:
                rows, cols = height // side, width // side
                boxes = [(c * side, r * side, (c + 1) * side, (r + 1) * side) for r in range(rows) for c in range(cols)]
                tiles = [image.crop(box) for box in boxes]
        tiles.append(image.resize((side, side), resample=self.resample))
        return [normalized(t, self.rescale, self.mean, self.std) for t in tiles], self._text(rows, cols)

    def _text(self, rows: int, cols: int) -> str:
        run = self.image_token * self.n_tokens
        whole = f"{self.fake_token}{self.global_token}{run}{self.fake_token}"
        if rows == 0 and cols == 0:
            return whole
        grid = "".join(
            "".join(f"{self.fake_token}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows)
        )
        return f"{grid}\n{whole}"


def gemma3_images(settings: ImageSettings, hf_tokenizer, spec) -> Gemma3Images:
    text = image_text(hf_tokenizer, spec.image_token_id, spec.boi_token_id, spec.eoi_token_id, spec.tokens_per_image)
    return Gemma3Images(settings, text)


def image_prompts(model_type: str, folder: Path | None, hf_tokenizer, spec) -> Gemma3Images | SmolVLMImages:
    """The family's image layout for a checkpoint (``spec``: its MediaConfig; ``folder``:
    where its preprocessor_config.json may be)."""
    if model_type in ("smolvlm", "idefics3"):
        return SmolVLMImages.of_checkpoint(folder, spec.vision, spec.tokens_per_image)
    settings = ImageSettings.of_checkpoint(folder, int(spec.vision.get("image_size", 224)))
    if "image_mean" in spec.vision:  # a GGUF projector's own (a folder's are in its preprocessor_config.json)
        mean, std = tuple(spec.vision["image_mean"]), tuple(spec.vision["image_std"])
        settings = dataclasses.replace(settings, mean=mean, std=std)
    return gemma3_images(settings, hf_tokenizer, spec)


def expand(layout, text: str, images: list, marker: str) -> tuple[str, list[torch.Tensor]]:
    """``text`` with each ``marker`` replaced by its image's text (images: RGB PIL images,
    one per marker, in order) -> (the text, every frame in prompt order)."""
    pieces = text.split(marker)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"the template placed {len(pieces) - 1} of the request's {len(images)} images")
    out, frames = [pieces[0]], []
    for image, piece in zip(images, pieces[1:]):
        image_frames, its_text = layout.frames(image)
        frames += image_frames
        out += [its_text, piece]
    return "".join(out), frames
