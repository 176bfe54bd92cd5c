"""SmolVLM / Idefics3 images (issue 38): a tiny random checkpoint built by transformers
is the oracle. Each image is tiled (2 x 2 tiles of the encoder's side plus the whole
image, transformers' SmolVLM image processor) and every frame folds to 4 tokens by the
pixel shuffle; greedy tokens identical and logits within 1e-4 in float32 for one image,
two images, an image after a cached prefix and through the server's chat route; the
language model attends causally over image tokens (no bidirectional block)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from checkpoints import make_smolvlm
from vision_tools import greedy, media_prompt, picture

from engine import Engine, SamplingParams
from engine.core.media import MediaItem
from engine.text.image_prompts import SmolVLMImages, expand

N_NEW = 10
PER_FRAME = 4


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smolvlm") / "m"
    model, tok = make_smolvlm(folder)
    return folder, model, tok


@pytest.fixture(scope="module")
def engine(smolvlm):
    return Engine.from_pretrained(str(smolvlm[0]), n_ctx=1024, n_seq_max=2, max_batch_tokens=16)


def processor(split: bool = True):
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    return SmolVLMImageProcessorPil(
        size={"longest_edge": 56}, max_image_size={"longest_edge": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        do_image_splitting=split,
    )  # fmt: skip


def layout(folder, split: bool = True) -> SmolVLMImages:
    return dataclasses.replace(SmolVLMImages.of_checkpoint(folder, {"image_size": 28}, PER_FRAME), split=split)


def prompt_ids(smolvlm, text: str, images: list) -> tuple[list[int], list[MediaItem], torch.Tensor]:
    """Our prompt for ``text`` with images at ``<__media__>``: ids, media items, and the
    frames stacked for transformers [1, F, 3, 28, 28]."""
    folder, _, tok = smolvlm
    ids, media = media_prompt(layout(folder), lambda t: tok.encode(t).ids, tok.token_to_id("<image>"), text, images)
    return ids, media, torch.stack([m.pixels for m in media])[None]


def reference(model, ids: list[int], pixels: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    out = model.generate(
        torch.tensor([ids]), pixel_values=pixels, max_new_tokens=N_NEW, do_sample=False, output_logits=True,
        return_dict_in_generate=True, pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
    )  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]


def ours(engine: Engine, ids, media, seq_id: int = 0, n_cached: int = 0) -> tuple[list[int], torch.Tensor]:
    return greedy(engine, ids, media, N_NEW, seq_id, n_cached)


def test_frames_and_text_are_transformers_processors(smolvlm):
    """Tiles, the whole image and the image's prompt string equal transformers' SmolVLM
    PIL image processor and its processor's prompt string, for a wide, a tall and a
    small image (scaled up: tiled too), and without tiling (the processor itself needs
    torchvision for video)."""
    from gguf_tools import mtmd_photo
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    folder = smolvlm[0]
    cases = ((picture(1), True, 4), (picture(2, 60, 20), True, 2), (picture(3, 12, 9), True, 4), (picture(1), False, 0))
    cases += ((mtmd_photo(), True, 4),)  # llama.cpp's test photo: a JPEG, landscape
    for image, split, tiles in cases:
        expected = processor(split)(images=[[image]], return_tensors="pt", return_row_col_info=True)
        rows, cols = expected["rows"][0][0], expected["cols"][0][0]
        assert rows * cols == tiles
        want = get_image_prompt_string(rows, cols, PER_FRAME, "<fake_token_around_image>", "<image>", "<global-img>")
        text, frames = expand(layout(folder, split), "look <__media__> here", [image], "<__media__>")
        assert text == f"look {want} here"
        theirs = expected["pixel_values"][0]  # [F, 3, 28, 28]
        assert len(frames) == theirs.shape[0] == tiles + 1
        assert (torch.stack(frames) - theirs).abs().max() < 1e-6


def test_one_tiled_image_matches_transformers(smolvlm, engine):
    ids, media, pixels = prompt_ids(smolvlm, "User: what is <__media__> this?\nAssistant:", [picture(4)])
    assert len(media) == 5  # 2 x 2 tiles and the whole image
    expect, expect_logits = reference(smolvlm[1], ids, pixels)
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_two_images_match_transformers(smolvlm, engine):
    ids, media, pixels = prompt_ids(smolvlm, "<__media__> and <__media__>?", [picture(5, 50, 30), picture(6, 90, 20)])
    assert len(media) == 5 + 3  # scaled up to 56 high: 2 x 2 and 2 x 1 tiles, each with its whole image
    expect, expect_logits = reference(smolvlm[1], ids, pixels)
    engine.memory.seq_rm(0)
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_an_image_after_a_cached_prefix(smolvlm, engine):
    ids, media, pixels = prompt_ids(smolvlm, "a long question before the picture: <__media__>.", [picture(7)])
    expect, expect_logits = reference(smolvlm[1], ids, pixels)
    engine.memory.seq_rm(1)
    head = media[0].start + 2  # the cache ends inside the first frame
    engine.add_sequence(ids[:head], SamplingParams(temperature=0.0, max_tokens=1), 1)
    while engine.has_work:
        engine.step()
    tokens, logits = ours(engine, ids, media, seq_id=1, n_cached=head)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_idefics3_loads_as_smolvlm(tmp_path):
    model, tok = make_smolvlm(tmp_path / "m", arch="Idefics3")
    engine = Engine.from_pretrained(str(tmp_path / "m"), n_ctx=512, n_seq_max=1)
    ids, media, pixels = prompt_ids((tmp_path / "m", model, tok), "see <__media__>", [picture(8)])
    expect, expect_logits = reference(model, ids, pixels)
    tokens, logits = ours(engine, ids, media)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_position_buckets_are_transformers(smolvlm):
    """NaViT's bucketed position ids equal transformers' for grid sides where float
    rounding repeats a row (19, 25), which an arange would not."""
    from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionEmbeddings

    from engine.models.vision.siglip import navit_positions

    for side in (4, 19, 25, 32):
        theirs = SmolVLMVisionEmbeddings(SmolVLMVisionConfig(hidden_size=1, image_size=side, patch_size=1))
        with torch.no_grad():
            theirs.patch_embedding.weight.zero_(), theirs.patch_embedding.bias.zero_()
            theirs.position_embedding.weight.copy_(torch.arange(side * side, dtype=torch.float32)[:, None])
        mask = torch.ones(1, side, side, dtype=torch.bool)
        ids = theirs(torch.zeros(1, 3, side, side), mask)[0, :, 0].long()  # [P]
        assert torch.equal(navit_positions(side, side, side, torch.device("cpu")), ids)
    assert not torch.equal(navit_positions(19, 19, 19, torch.device("cpu")), torch.arange(19 * 19))


@pytest.fixture(scope="module")
def server(smolvlm, tmp_path_factory):
    from server_proc import ServerProcess

    slots = str(tmp_path_factory.mktemp("slots"))
    with ServerProcess("-m", str(smolvlm[0]), "-np", "2", "-c", "2048", "--slot-save-path", slots) as srv:
        srv.wait_ready()
        yield srv


def test_the_chat_route_answers_as_transformers_does(smolvlm, server):
    """An image through the openai client: the template's text with the image's tiles
    where the image part was; a follow-up with the same image reuses all its frames."""
    import base64
    import io

    from openai import OpenAI

    image = picture(9)
    png = io.BytesIO()
    image.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    content = [{"type": "text", "text": "what is "}, {"type": "image_url", "image_url": {"url": url}}]
    messages = [{"role": "user", "content": content}]
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=N_NEW, temperature=0,
                                            logprobs=True)  # fmt: skip
    ids, media, pixels = prompt_ids(smolvlm, "user: what is <__media__>\n", [image])
    expect, expect_logits = reference(smolvlm[1], ids, pixels)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].message.content == smolvlm[2].decode(expect, skip_special_tokens=True)
    want = expect_logits.log_softmax(-1).gather(1, torch.tensor(expect)[:, None])[:, 0].tolist()
    assert [t.logprob for t in answer.choices[0].logprobs.content] == pytest.approx(want, abs=1e-4)
    again = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= media[-1].end


def test_a_restored_slot_continues_the_conversation_as_transformers_does(smolvlm, server):
    """A slot holding a tiled image (five frames) is saved, erased and restored; the next
    turn reuses every frame's cache, and its answer is transformers' on the whole
    conversation."""
    from vision_tools import restored_turn

    image = picture(10, 40, 70)
    said, answer = restored_turn(server.url, image, "smol.slot", N_NEW, 20)
    ids, media, pixels = prompt_ids(smolvlm, f"user: look: <__media__>\nassistant: {said}\nuser: why?\n", [image])
    expect, _ = reference(smolvlm[1], ids, pixels)
    assert len(media) == 5 and answer.usage.prompt_tokens == len(ids)
    assert answer.usage.prompt_tokens_details.cached_tokens >= media[-1].end
    assert answer.choices[0].message.content == smolvlm[2].decode(expect, skip_special_tokens=True)
