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


def qwen_reference(model, ids: list[int], pixels, grid, n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of a Qwen-VL prompt (``pixels`` and ``grid``:
    its image processor's ``pixel_values`` and ``image_grid_thw``): (n tokens, logits [n, V])."""
    input_ids = torch.tensor([ids])
    image_id = model.config.image_token_id
    out = model.generate(
        input_ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(input_ids == image_id).int(),
        max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        attention_mask=torch.ones_like(input_ids),
    )  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]


def convert_pair(text: Path, vision: Path, root: Path, flags: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """The language model of ``text`` and the projector of ``vision`` (folders; often the
    same) as float32 GGUFs by llama.cpp's converter (``flags``: more of its options for
    the language model): (model.gguf, mmproj.gguf)."""
    from gguf_tools import _run_converters

    model, mmproj = root / "model.gguf", root / "mmproj.gguf"
    _run_converters([[
        ("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", *flags, str(text)], None),
        ("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", str(vision)], None),
    ]])  # fmt: skip
    return model, mmproj


def restored_turn(url: str, image, filename: str, n_new: int, n_erased_min: int):
    """A chat turn about ``image`` in slot 1, the slot saved, erased and restored, then the
    next turn ("why?") in it: (what the first turn said, the second turn's answer)."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none")
    turn = [{"role": "user", "content": [{"type": "text", "text": "look: "}, image_part(image)]}]
    first = client.chat.completions.create(model="m", messages=turn, max_tokens=4, temperature=0,
                                           extra_body={"id_slot": 1})  # fmt: skip
    slot = lambda action, **body: httpx.post(f"{url}/slots/1", params={"action": action}, json=body)  # noqa: E731
    assert slot("save", filename=filename).status_code == 200
    assert slot("erase").json()["n_erased"] > n_erased_min
    assert slot("restore", filename=filename).status_code == 200
    said = first.choices[0].message.content
    turns = turn + [{"role": "assistant", "content": said}, {"role": "user", "content": "why?"}]
    answer = client.chat.completions.create(model="m", messages=turns, max_tokens=n_new, temperature=0,
                                            extra_body={"id_slot": 1})  # fmt: skip
    return said, answer
