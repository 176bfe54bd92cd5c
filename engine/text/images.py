"""Images into a model's pixel tensors, with Pillow: decode (any format Pillow reads),
RGB, resize to the encoder's square with the checkpoint's resampling, rescale, normalize,
channels first. The settings come from the checkpoint's ``preprocessor_config.json``
(transformers' image processor fields), defaulting to the encoder's size and SigLIP's
mean and std of 0.5; the arithmetic follows transformers' PIL image processors, so the
pixels equal theirs (tests/test_vision.py)."""

from __future__ import annotations

import io
import json
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

MAX_PIXELS = 50_000_000  # one image (a 45-50 MP camera's photo); Pillow's decompression-bomb limit is ~89M
MAX_IMAGES = 16  # in one request, across all its prompts
REQUEST_BYTES = 1 << 30  # one request's images: encoded, decoded and as the model's tensors
DECODED_BYTES_PER_PIXEL = 4  # Pillow's decode and its RGB copy


def processor_settings(folder: Path | None) -> dict:
    """The image processor's settings in a checkpoint folder: ``preprocessor_config.json``
    (transformers 4's layout), else ``processor_config.json``'s ``image_processor`` (the
    only file transformers 5 writes), else none."""
    if folder is None or not folder.is_dir():
        return {}
    old = folder / "preprocessor_config.json"
    if old.is_file():
        return json.loads(old.read_text(encoding="utf-8"))
    new = folder / "processor_config.json"
    if new.is_file():
        inner = json.loads(new.read_text(encoding="utf-8")).get("image_processor")
        return inner if isinstance(inner, dict) else {}
    return {}


class BadImage(ValueError):
    """The bytes are no image Pillow reads, or one too large."""


class ImageBudget:
    """What one request's images may take, across all its prompts and routes: at most
    ``images`` images, and ``nbytes`` bytes of encoded files, decoded pixels and the
    model's tensors together. A file is counted as it comes, a decode from the
    image's header before it runs, the tensors as each image's frames are made (so
    a request goes over by one image's frames at most before it is refused). Raises
    BadImage naming the part; one budget per request, used by one thread at a time."""

    def __init__(self, images: int = MAX_IMAGES, nbytes: int = REQUEST_BYTES):
        self.images, self.nbytes = images, nbytes

    def count(self, n: int, where: str) -> None:
        if n > self.images:
            raise BadImage(f"{where}: at most {MAX_IMAGES} images a request (across all its prompts)")
        self.images -= n

    def take(self, n: int, where: str, what: str) -> None:
        if n > self.nbytes:
            raise BadImage(
                f"{where}: {what} ({n / 2**20:.0f} MiB) is over what is left of the request's "
                f"{REQUEST_BYTES >> 20} MiB for images"
            )
        self.nbytes -= n


class ImagesBusy(Exception):
    """The process holds as many image frames as it takes: a retry later can pass."""


PENDING_BYTES = 4 << 30  # every request's frames together, from their making until they are freed


class FramePool:
    """Image frames of all requests together (a request's budget bounds its own: 256
    queued requests could each hold 1 GiB). Frames are counted when made and given
    back when the tensors are freed (a finalizer on each), however their request ends:
    answered, refused, cancelled. Thread-safe: frames are made in worker threads."""

    def __init__(self, nbytes: int = PENDING_BYTES):
        self.nbytes, self.held = nbytes, 0
        self._lock = threading.Lock()

    def hold(self, frames: list[torch.Tensor], where: str) -> None:
        """Count ``frames``; ImagesBusy when they do not fit beside the frames held."""
        sizes = [f.numel() * f.element_size() for f in frames]
        with self._lock:
            if self.held + sum(sizes) > self.nbytes:
                raise ImagesBusy(
                    f"{where}: the server holds {self.held >> 20} MiB of images for pending requests, "
                    f"of {self.nbytes >> 20} MiB; retry when they are done"
                )
            self.held += sum(sizes)
        for frame, n in zip(frames, sizes, strict=True):
            weakref.finalize(frame, self._give_back, n)

    def _give_back(self, n: int) -> None:
        with self._lock:
            self.held -= n


FRAMES = FramePool()  # the process's


@dataclass(frozen=True)
class ImageSettings:
    height: int
    width: int
    resample: int = 2  # PIL's BILINEAR
    rescale: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @classmethod
    def of_checkpoint(cls, folder: Path | None, image_size: int) -> ImageSettings:
        """The folder's image processor settings (``processor_settings``), else the encoder's size."""
        raw = processor_settings(folder)
        size = raw.get("size") or {}
        return cls(
            height=int(size.get("height", image_size)),
            width=int(size.get("width", image_size)),
            resample=int(raw.get("resample", 2)),
            rescale=float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else 1.0,
            mean=tuple(raw.get("image_mean", (0.5, 0.5, 0.5))) if raw.get("do_normalize", True) else (0.0,) * 3,
            std=tuple(raw.get("image_std", (0.5, 0.5, 0.5))) if raw.get("do_normalize", True) else (1.0,) * 3,
        )


def open_image(data: bytes, budget: ImageBudget | None = None, where: str = "the image"):
    """Bytes -> a PIL image with only its header read; BadImage when Pillow cannot read
    them, the image has more than MAX_PIXELS pixels, or decoding it would overrun
    ``budget`` (taken here, before any decode)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise BadImage(f"not an image Pillow can read: {exc}") from None
    if image.width * image.height > MAX_PIXELS:
        raise BadImage(f"the image is {image.width}x{image.height}: more than {MAX_PIXELS} pixels")
    if budget is not None:
        budget.take(image.width * image.height * DECODED_BYTES_PER_PIXEL, where, "its decoded pixels")
    return image


def load_rgb(image):
    """An opened image (``open_image``) decoded, as RGB; BadImage when its data is broken."""
    from PIL import Image

    try:
        image.load()
    except (OSError, Image.DecompressionBombError) as exc:
        raise BadImage(f"not an image Pillow can read: {exc}") from None
    return image.convert("RGB")


def decode_image(data: bytes):
    """Bytes -> an RGB PIL image (``open_image`` then ``load_rgb``)."""
    return load_rgb(open_image(data))


def normalized(image, rescale: float, mean, std) -> torch.Tensor:
    """An RGB PIL image -> [3, H, W] float32: rescaled, then (x - mean) / std per channel."""
    x = np.asarray(image, dtype=np.float32) * np.float32(rescale)  # [H, W, 3]
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))  # [3, H, W]


def pixels(image, settings: ImageSettings) -> torch.Tensor:
    """An RGB PIL image -> [3, height, width] float32, as the model's processor makes it."""
    resized = image.resize((settings.width, settings.height), resample=settings.resample)
    return normalized(resized, settings.rescale, settings.mean, settings.std)


def image_text(hf_tokenizer, image_token_id: int, boi_id: int | None, eoi_id: int | None, n_tokens: int) -> str:
    """What one image becomes in the prompt's text before tokenizing, as Gemma 3's
    processor writes it: a blank line, begin-of-image, ``n_tokens`` image tokens,
    end-of-image, a blank line (the tokens' own texts, so one tokenization of the whole
    prompt gives transformers' ids)."""
    piece = hf_tokenizer.id_to_token
    image = piece(image_token_id) * n_tokens
    begin = piece(boi_id) if boi_id is not None else ""
    end = piece(eoi_id) if eoi_id is not None else ""
    return f"\n\n{begin}{image}{end}\n\n"


def placeholder_starts(ids: list[int], image_token_id: int, counts: list[int]) -> list[int]:
    """The first position of each frame's image tokens in ``ids``, the frames taking
    ``counts`` tokens each, in order (adjacent frames may share a run). ValueError when
    the runs do not add up to the frames: the text held image tokens of its own."""
    starts, i, k = [], 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == image_token_id:
            j += 1
        while i < j and k < len(counts) and i + counts[k] <= j:
            starts.append(i)
            i, k = i + counts[k], k + 1
        if i != j:
            raise ValueError("the prompt's text holds image tokens of its own")
    if k != len(counts):
        raise ValueError("the prompt's text holds image tokens of its own")
    return starts
