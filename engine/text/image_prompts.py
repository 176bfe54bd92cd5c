"""What one image becomes in a prompt, per model family: its frames (the pixel tensors
the encoder takes, each ``tokens_per_image`` positions) and the text that stands for it,
whose runs of image tokens are the frames' placeholders, in order. The arithmetic
follows transformers' PIL image processors and its processors' prompt strings, so ids
and pixels equal theirs (tests/test_vision.py, tests/test_smolvlm.py).

- Gemma 3: one frame, the image squashed to the encoder's square; the text is a blank
  line, begin-of-image, the image tokens, end-of-image, a blank line.
- Qwen2.5-VL: the image resized to multiples of 28 pixels within a pixel budget, its
  14-pixel patches block-major (QwenImages); its token count follows its size.
- SmolVLM / Idefics3: the image resized so its longest edge is ``size.longest_edge``,
  then up to multiples of the encoder's side and cut into side x side tiles, row by row,
  plus the whole image squashed to one tile (an image no larger than a tile: that one
  frame only). Each tile's tokens follow ``<fake_token_around_image><row_R_col_C>``, a
  row ends with a newline, the whole image comes last after
  ``\\n<fake_token_around_image><global-img>`` and closes with the fake token."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.text.images import FRAMES, ImageBudget, ImageSettings, image_text, normalized, pixels, processor_settings

LANCZOS = 1  # PIL's
MAX_SIDE = 4096  # transformers' absolute cap on a resized image's edge (Idefics3 / SmolVLM)


@dataclass(frozen=True)
class Gemma3Images:
    settings: ImageSettings
    text: str  # the text of one image
    n_tokens: int

    def frames(self, image) -> tuple[list[torch.Tensor], str]:
        """An RGB PIL image -> ([C, H, W] frames, the text that stands for it)."""
        return [pixels(image, self.settings)], self.text

    def placeholders(self, frame: torch.Tensor) -> tuple[int, None]:
        """A frame's image tokens, and its grid where positions follow it (none here)."""
        return self.n_tokens, None


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
        """The folder's image processor settings (``processor_settings``), else transformers'
        defaults for the encoder's side."""
        raw = processor_settings(folder)
        tile = int((raw.get("max_image_size") or {}).get("longest_edge", vision.get("image_size", 224)))
        normalize = raw.get("do_normalize", True)
        longest = vision.get("preproc_image_size", 4 * tile)  # a GGUF projector's (size.longest_edge)
        return cls(
            tile=tile,
            longest=int((raw.get("size") or {}).get("longest_edge", longest)),
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

    def placeholders(self, frame: torch.Tensor) -> tuple[int, None]:
        return self.n_tokens, None

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
    return Gemma3Images(settings, text, spec.tokens_per_image)


QWEN_IMAGE_TYPES = ("qwen2_5_vl", "qwen3_5", "qwen3_5_moe")  # Qwen2-VL's processor: size-led patches


def image_prompts(model_type: str, folder: Path | None, hf_tokenizer, spec, tokens=(None, None)):
    """The family's image layout for a checkpoint (``spec``: its MediaConfig; ``folder``:
    where its preprocessor_config.json may be): Gemma3Images, SmolVLMImages or QwenImages.
    ``tokens``: (fewest, most) tokens an image takes where its size varies (llama-server's
    --image-min-tokens / --image-max-tokens; None: the checkpoint's)."""
    if model_type in QWEN_IMAGE_TYPES:
        layout = QwenImages.of_checkpoint(folder, spec.vision, hf_tokenizer, spec)
        if "image_mean" in spec.vision:  # a GGUF projector's own
            layout = dataclasses.replace(
                layout, mean=tuple(spec.vision["image_mean"]), std=tuple(spec.vision["image_std"])
            )
        block = (layout.patch * layout.merge) ** 2  # pixels one token covers
        fewest, most = tokens
        if fewest is not None:
            layout = dataclasses.replace(layout, min_pixels=fewest * block)
        if most is not None:
            layout = dataclasses.replace(layout, max_pixels=most * block)
        return layout
    if model_type in ("smolvlm", "idefics3"):
        layout = SmolVLMImages.of_checkpoint(folder, spec.vision, spec.tokens_per_image)
        if "image_mean" in spec.vision:  # a GGUF projector's own
            layout = dataclasses.replace(
                layout, mean=tuple(spec.vision["image_mean"]), std=tuple(spec.vision["image_std"])
            )
        return layout
    settings = ImageSettings.of_checkpoint(folder, int(spec.vision.get("image_size", 224)))
    if "image_mean" in spec.vision:  # a GGUF projector's own (a folder's are in its preprocessor_config.json)
        mean, std = tuple(spec.vision["image_mean"]), tuple(spec.vision["image_std"])
        settings = dataclasses.replace(settings, mean=mean, std=std)
    return gemma3_images(settings, hf_tokenizer, spec)


def expand(
    layout, text: str, images: list, marker: str, budget: ImageBudget | None = None, where: str = "image"
) -> tuple[str, list[torch.Tensor]]:
    """``text`` with each ``marker`` replaced by its image's text (images: RGB PIL images,
    one per marker, in order) -> (the text, every frame in prompt order). Each image's
    frames are taken from ``budget`` (BadImage past it)."""
    pieces = text.split(marker)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"the template placed {len(pieces) - 1} of the request's {len(images)} images")
    out, frames = [pieces[0]], []
    for i, (image, piece) in enumerate(zip(images, pieces[1:])):
        image_frames, its_text = layout.frames(image)
        if budget is not None:
            nbytes = sum(f.numel() * f.element_size() for f in image_frames)
            budget.take(nbytes, f"{where} {i}", "its tensors for the model")
            FRAMES.hold(image_frames, f"{where} {i}")  # and the process's, for all pending requests
        frames += image_frames
        out += [its_text, piece]
    return "".join(out), frames


OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BICUBIC = 3  # PIL's


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's size rule: both edges multiples of ``factor``, the area within
    [min_pixels, max_pixels], the aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the image's aspect ratio is over 200 ({width} x {height})")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = (
            max(factor, math.floor(height / beta / factor) * factor),
            max(factor, math.floor(width / beta / factor) * factor),
        )
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


@dataclass(frozen=True)
class QwenImages:
    """Qwen2.5-VL: the image resized by ``smart_resize`` (bicubic, as transformers), cut
    in patch x patch squares, each 2 x 2 block of them one token; the frame is its
    patches, block-major, each patch twice over in time: [rows, cols, merge**2, C * 2 * p * p]
    (rows x cols tokens); its text ``<|vision_start|>``, the tokens, ``<|vision_end|>``."""

    image_piece: str
    begin: str
    end: str
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch: int = 14
    merge: int = 2
    temporal: int = 2
    resample: int = BICUBIC
    rescale: float = 1 / 255
    mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    std: tuple[float, ...] = OPENAI_CLIP_STD

    @classmethod
    def of_checkpoint(cls, folder: Path | None, vision: dict, hf_tokenizer, spec) -> QwenImages:
        raw = processor_settings(folder)
        size = raw.get("size") or {}
        normalize = raw.get("do_normalize", True)
        piece = hf_tokenizer.id_to_token
        return cls(
            image_piece=piece(spec.image_token_id),
            begin=piece(spec.boi_token_id) if spec.boi_token_id is not None else "",
            end=piece(spec.eoi_token_id) if spec.eoi_token_id is not None else "",
            min_pixels=int(raw.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(raw.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            patch=int(raw.get("patch_size", vision.get("patch_size", 14))),
            merge=int(raw.get("merge_size", vision.get("spatial_merge_size", 2))),
            temporal=int(raw.get("temporal_patch_size", vision.get("temporal_patch_size", 2))),
            resample=int(raw.get("resample", BICUBIC)),
            rescale=float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else 1.0,
            mean=tuple(raw.get("image_mean", OPENAI_CLIP_MEAN)) if normalize else (0.0,) * 3,
            std=tuple(raw.get("image_std", OPENAI_CLIP_STD)) if normalize else (1.0,) * 3,
        )

    def frames(self, image) -> tuple[list[torch.Tensor], str]:
        """An RGB PIL image -> ([rows, cols, merge**2, C * T * p * p] patches, its text)."""
        p, m = self.patch, self.merge
        height, width = smart_resize(image.height, image.width, p * m, self.min_pixels, self.max_pixels)
        x = normalized(image.resize((width, height), resample=self.resample), self.rescale, self.mean, self.std)
        c, rows, cols = x.shape[0], height // (p * m), width // (p * m)
        x = x.reshape(c, rows, m, p, cols, m, p).permute(1, 4, 2, 5, 0, 3, 6)  # [R, C, m, m, ch, p, p]
        x = x[:, :, :, :, :, None].expand(rows, cols, m, m, c, self.temporal, p, p)  # each patch twice in time
        frame = x.reshape(rows, cols, m * m, c * self.temporal * p * p).contiguous()
        return [frame], f"{self.begin}{self.image_piece * (rows * cols)}{self.end}"

    def placeholders(self, frame: torch.Tensor) -> tuple[int, tuple[int, int]]:
        return frame.shape[0] * frame.shape[1], (frame.shape[0], frame.shape[1])
