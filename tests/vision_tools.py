"""What the image tests share: pictures they draw, a prompt with images laid out by a
checkpoint's own rules, greedy generation with images in the engine, and a
language-model + projector GGUF pair written by llama.cpp's converter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine import Engine, SamplingParams
from engine.core.media import MediaItem


def picture(seed: int, height: int = 33, width: int = 41):
    """A random RGB PIL image."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def image_part(image) -> dict:
    """A PIL image as an OpenAI chat content part (a PNG data: URL)."""
    import base64
    import io

    png = io.BytesIO()
    image.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def media_prompt(layout, tokenizer, image_token: int, text: str, images: list) -> tuple[list[int], list[MediaItem]]:
    """``text`` with ``images`` at its ``<__media__>`` markers, laid out by ``layout``
    (engine/text/image_prompts.py) and tokenized by ``tokenizer`` (its ``encode(text)``
    giving ids, or an ``.ids`` object): the ids and a MediaItem per frame."""
    from engine.text.image_prompts import expand
    from engine.text.images import placeholder_starts

    expanded, frames = expand(layout, text, images, "<__media__>")
    ids = tokenizer(expanded)
    shapes = [layout.placeholders(f) for f in frames]
    starts = placeholder_starts(ids, image_token, [n for n, _ in shapes])
    return ids, [MediaItem.image(s, n, f, grid) for s, (n, grid), f in zip(starts, shapes, frames)]


def engine_prompt(engine: Engine, folder, text: str, images: list, tokens=(None, None)):
    """``media_prompt`` by an engine's own layout and tokenizer (BOS as the server adds it)."""
    from engine.text.image_prompts import image_prompts

    cfg = engine.model_config
    layout = image_prompts(cfg.model_type, folder, engine.tokenizer.hf, cfg.media, tokens)
    encode = lambda t: engine.tokenizer.encode(t, add_special=True)  # noqa: E731
    return media_prompt(layout, encode, cfg.media.image_token_id, text, images)


def greedy(engine: Engine, ids, media, n: int, seq_id: int = 0, n_cached: int = 0) -> tuple[list[int], torch.Tensor]:
    """The engine's greedy continuation of a prompt with images: (n tokens, logits [n, V])."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seq = engine.add_sequence(ids, params, seq_id, n_cached=n_cached, media=media)
    logits = []
    while engine.has_work:
        logits += [e.logits for e in engine.step(keep_logits=True) if e.token_id is not None]
    return seq.output_ids, torch.stack(logits)


def convert_pair(text: Path, vision: Path, root: Path) -> tuple[Path, Path]:
    """The language model of ``text`` and the projector of ``vision`` (folders; often the
    same) as float32 GGUFs by llama.cpp's converter: (model.gguf, mmproj.gguf)."""
    from gguf_tools import _run_converters

    model, mmproj = root / "model.gguf", root / "mmproj.gguf"
    _run_converters([[
        ("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", str(text)]),
        ("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", str(vision)]),
    ]])  # fmt: skip
    return model, mmproj
