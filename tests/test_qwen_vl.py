"""Qwen2.5-VL images (issue 38): a tiny random checkpoint built by transformers is the
oracle. Images of several sizes take several token counts; the vision transformer
attends within windows and then over the whole image; the language model rotates by
M-RoPE positions (an image's tokens by their grid, the text after it from the image's
largest side on). Greedy tokens identical and logits within 1e-4 in float32 for one
image, two images of different sizes, an image after a cached prefix and through the
server's chat route."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_qwen2_5_vl
from vision_tools import greedy, image_part, media_prompt, picture, qwen_reference

from engine import Engine, SamplingParams
from engine.core.media import MediaItem, mrope_positions
from engine.models.config import load_model_config
from engine.text.image_prompts import QwenImages

N_NEW = 10


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen25vl") / "m"
    model, tok = make_qwen2_5_vl(folder)
    return folder, model, tok


@pytest.fixture(scope="module")
def engine(qwen):
    return Engine.from_pretrained(str(qwen[0]), n_ctx=1024, n_seq_max=2, max_batch_tokens=16)


def layout(qwen) -> QwenImages:
    spec = load_model_config(qwen[0]).media
    return QwenImages.of_checkpoint(qwen[0], spec.vision, qwen[2], spec)  # qwen[2]: a tokenizers.Tokenizer


def transformers_pixels(images: list) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    out = proc(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def prompt_ids(qwen, text: str, images: list) -> tuple[list[int], list[MediaItem]]:
    tok = qwen[2]
    return media_prompt(layout(qwen), lambda t: tok.encode(t).ids, tok.token_to_id("<|image_pad|>"), text, images)


def reference(model, ids: list[int], images: list) -> tuple[list[int], torch.Tensor]:
    return qwen_reference(model, ids, *transformers_pixels(images), N_NEW)


def ours(engine: Engine, ids, media, seq_id: int = 0, n_cached: int = 0) -> tuple[list[int], torch.Tensor]:
    return greedy(engine, ids, media, N_NEW, seq_id, n_cached)


def test_patches_equal_transformers_processor(qwen):
    """Sizes within the pixel budget, above it and below it, and llama.cpp's test photo:
    the same patches and grid."""
    from gguf_tools import mtmd_photo

    for image in [picture(h, h, w) for h, w in ((60, 90), (300, 200), (20, 30))] + [mtmd_photo()]:
        pixels, grid = transformers_pixels([image])
        (frame,), _ = layout(qwen).frames(image)
        assert (frame.shape[0] * 2, frame.shape[1] * 2) == tuple(grid[0, 1:].tolist())
        assert (frame.reshape(-1, frame.shape[-1]) - pixels).abs().max() < 1e-5


def test_mrope_positions_are_transformers(qwen):
    """Text, an image of 2 x 3 tokens, text, an image of 4 x 4, text: the rotary
    positions transformers' get_rope_index gives, in chunks of any size."""
    model = qwen[1]
    image = model.config.image_token_id
    ids = [1, 2] + [image] * 6 + [3, 4, 5] + [image] * 16 + [6]
    input_ids = torch.tensor([ids])
    grid = torch.tensor([[1, 4, 6], [1, 8, 8]])  # patches (merge 2): 2 x 3 and 4 x 4 tokens
    want, _ = model.model.get_rope_index(input_ids, (input_ids == image).int(), image_grid_thw=grid)
    media = [MediaItem(2, 6, "a", None, grid=(2, 3)), MediaItem(11, 16, "b", None, grid=(4, 4))]
    assert torch.equal(mrope_positions(media, 0, len(ids)), want[:, 0])
    assert torch.equal(torch.cat([mrope_positions(media, s, 5) for s in range(0, 25, 5)], 1), want[:, 0, :25])


def test_one_image_matches_transformers(qwen, engine):
    image = picture(1, 110, 84)
    ids, media = prompt_ids(qwen, "what is <__media__> this?", [image])
    assert media[0].grid == (4, 3)  # 112 x 84 pixels: 4 x 3 tokens, two windows across
    expect, expect_logits = reference(qwen[1], ids, [image])
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_the_test_photo_matches_transformers(qwen, engine):
    """llama.cpp's multimodal test photo (a landscape JPEG), resized into the pixel budget."""
    from gguf_tools import mtmd_photo

    image = mtmd_photo()
    ids, media = prompt_ids(qwen, "describe <__media__>", [image])
    engine.memory.seq_rm(0)
    expect, expect_logits = reference(qwen[1], ids, [image])
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_two_images_of_other_sizes_match_transformers(qwen, engine):
    images = [picture(2, 56, 56), picture(3, 120, 120)]
    ids, media = prompt_ids(qwen, "<__media__> or <__media__>?", images)
    assert [m.n_tokens for m in media] == [4, 16]
    expect, expect_logits = reference(qwen[1], ids, images)
    engine.memory.seq_rm(0)
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_an_image_after_a_cached_prefix(qwen, engine):
    image = picture(4, 80, 110)
    ids, media = prompt_ids(qwen, "a question before the picture: <__media__> and after", [image])
    expect, expect_logits = reference(qwen[1], ids, [image])
    engine.memory.seq_rm(1)
    head = media[0].start + 2
    engine.add_sequence(ids[:head], SamplingParams(temperature=0.0, max_tokens=1), 1)
    while engine.has_work:
        engine.step()
    tokens, logits = ours(engine, ids, media, seq_id=1, n_cached=head)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_a_transformers_5_processor_config_gives_the_processors_tokens(qwen, tmp_path):
    """transformers 5 writes the image processor's settings into processor_config.json
    (no preprocessor_config.json): they are read there, so a 300 x 300 image is the
    processor's 9 tokens, not the defaults' 121 (min 56 x 56, max 28 x 28 x 1280 pixels)."""
    import json
    import shutil

    new = tmp_path / "t5"
    shutil.copytree(qwen[0], new)
    settings = json.loads((new / "preprocessor_config.json").read_text())
    (new / "preprocessor_config.json").unlink()
    (new / "processor_config.json").write_text(
        json.dumps({"image_processor": settings, "processor_class": "Qwen2_5_VLProcessor"})
    )
    spec = load_model_config(new).media
    image = picture(6, 300, 300)  # over the checkpoint's 112 x 112 budget, under the defaults'
    (frame,), _ = QwenImages.of_checkpoint(new, spec.vision, qwen[2], spec).frames(image)
    _, grid = transformers_pixels([image])
    assert frame.shape[0] * frame.shape[1] == int(grid[0].prod()) // 4 == 9


def test_a_transformers_4_config_loads_the_same(qwen, tmp_path):
    """transformers 4 wrote Qwen2.5-VL's language fields at the top level, with
    ``rope_scaling: {type: mrope}``: the same model, the same tokens."""
    import json
    import shutil

    old = tmp_path / "t4"
    shutil.copytree(qwen[0], old)
    cfg = json.loads((old / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    cfg |= text | {"rope_theta": rope["rope_theta"], "torch_dtype": cfg.pop("dtype", "float32")}
    cfg["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    cfg["model_type"] = "qwen2_5_vl"
    (old / "config.json").write_text(json.dumps(cfg))
    image = picture(5, 70, 100)
    ids, media = prompt_ids(qwen, "see <__media__>", [image])
    expect, _ = reference(qwen[1], ids, [image])
    engine = Engine.from_pretrained(str(old), n_ctx=256, n_seq_max=1)
    assert ours(engine, ids, media)[0] == expect


@pytest.fixture(scope="module")
def server(qwen, tmp_path_factory):
    from server_proc import ServerProcess

    slots = str(tmp_path_factory.mktemp("slots"))
    flags = ("-np", "2", "-c", "2048", "--image-max-tokens", "12", "--slot-save-path", slots)
    with ServerProcess("-m", str(qwen[0]), *flags) as srv:
        srv.wait_ready()
        yield srv


def test_the_chat_route_answers_as_transformers_does(qwen, server):
    """Two images of different sizes through the openai client, then the same again:
    transformers' tokens and log probabilities, and the follow-up reuses both images."""
    from openai import OpenAI

    images = [picture(6, 90, 60), picture(7, 60, 120)]
    parts = [image_part(image) for image in images]
    content = [{"type": "text", "text": "compare "}, parts[0], {"type": "text", "text": " with "}, parts[1]]
    messages = [{"role": "user", "content": content}]
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=N_NEW, temperature=0,
                                            logprobs=True)  # fmt: skip
    ids, media = prompt_ids(qwen, "user: compare <__media__> with <__media__>\n", images)
    expect, expect_logits = reference(qwen[1], ids, images)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].message.content == qwen[2].decode(expect, skip_special_tokens=True)
    want = expect_logits.log_softmax(-1).gather(1, torch.tensor(expect)[:, None])[:, 0].tolist()
    assert [t.logprob for t in answer.choices[0].logprobs.content] == pytest.approx(want, abs=1e-4)
    again = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= media[-1].end


def test_a_restored_slot_continues_the_conversation_as_transformers_does(qwen, server):
    """The slot that answered about an image is saved, erased and restored; the next turn
    of the conversation reuses the image's cache (its M-RoPE positions are the keys'),
    and its answer is transformers' on the whole conversation."""
    from vision_tools import restored_turn

    image = picture(9, 84, 112)
    said, answer = restored_turn(server.url, image, "qwen.slot", N_NEW, 10)
    ids, media = prompt_ids(qwen, f"user: look: <__media__>\nassistant: {said}\nuser: why?\n", [image])
    expect, _ = reference(qwen[1], ids, [image])
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.usage.prompt_tokens_details.cached_tokens >= media[0].end
    assert answer.choices[0].message.content == qwen[2].decode(expect, skip_special_tokens=True)


def test_image_max_tokens_caps_a_big_image(server):
    """--image-max-tokens 12 (the checkpoint allows 16): a 120 x 120 image is resized to
    84 x 84 pixels, 3 x 3 tokens, as transformers' processor with that pixel budget."""
    import base64
    import io

    import httpx

    png = io.BytesIO()
    picture(8, 120, 120).save(png, format="PNG")
    data = base64.b64encode(png.getvalue()).decode()
    body = {"content": {"prompt_string": "a<__media__>b", "multimodal_data": [data]}}
    (span,) = httpx.post(server.url + "/tokenize", json=body).json()["media"]
    assert span["n_tokens"] == 9
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 12 * 28 * 28})
    assert proc(images=[picture(8, 120, 120)], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 6, 6]]
