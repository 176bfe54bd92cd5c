"""Qwen3.5's vision tower (issue 52): tiny random Qwen3.5 and Qwen3.5-MoE checkpoints
with images, built by transformers, are the oracle. The tower resamples its learned
position table to each image's grid, rotates by the 2-D vision rotary and merges 2 x 2
patches into one token; the hybrid language model (Gated DeltaNet and gated attention)
rotates by interleaved M-RoPE positions. Greedy tokens identical and logits within 1e-4
in float32, for images of several sizes, after a cached prefix, from a GGUF with its
``--mmproj`` projector, and through the server's chat route with Qwen3.5's own chat
template (its prompt as transformers renders it and the processor expands it), a
follow-up turn that reuses the image, and a saved and restored slot."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_qwen3_5_vl
from vision_tools import convert_pair, engine_prompt, greedy, image_part, media_prompt, picture, qwen_reference

from engine import Engine, SamplingParams
from engine.models.config import load_model_config
from engine.text.image_prompts import QwenImages

N_NEW = 8


def template_text() -> str:
    from gguf_tools import converter_tree

    return (converter_tree() / "models" / "templates" / "Qwen3.5-4B.jinja").read_text()


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """The dense checkpoint, with Qwen3.5's chat template as transformers 5 saves it."""
    folder = tmp_path_factory.mktemp("qwen35vl") / "m"
    model, tok = make_qwen3_5_vl(folder)
    (folder / "chat_template.jinja").write_text(template_text())
    return folder, model, tok


@pytest.fixture(scope="module")
def engine(qwen):
    return Engine.from_pretrained(str(qwen[0]), n_ctx=1024, n_seq_max=2, max_batch_tokens=16)


def transformers_pixels(images: list) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 64 * 64, "longest_edge": 128 * 128}, patch_size=16, image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )  # fmt: skip
    out = proc(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def prompt_ids(qwen, text: str, images: list):
    folder, _, tok = qwen
    spec = load_model_config(folder).media
    layout = QwenImages.of_checkpoint(folder, spec.vision, tok, spec)
    return media_prompt(layout, lambda t: tok.encode(t).ids, tok.token_to_id("<|image_pad|>"), text, images)


def reference(model, ids: list[int], images: list, n: int = N_NEW) -> tuple[list[int], torch.Tensor]:
    return qwen_reference(model, ids, *transformers_pixels(images), n)


def test_patches_equal_transformers_processor(qwen):
    """16-pixel patches, sizes within the pixel budget, above it and below it."""
    for image in [picture(h, h, w) for h, w in ((70, 90), (300, 200), (20, 30))]:
        pixels, grid = transformers_pixels([image])
        (_, media) = prompt_ids(qwen, "<__media__>", [image])
        frame = media[0].pixels
        assert (frame.shape[0] * 2, frame.shape[1] * 2) == tuple(grid[0, 1:].tolist())
        assert (frame.reshape(-1, frame.shape[-1]) - pixels).abs().max() < 1e-5


def test_two_images_of_other_sizes_match_transformers(qwen, engine):
    """A 3 x 3 and a 2 x 4 image: the position table resampled to each grid, the
    interleaved M-RoPE positions of the text after each."""
    images = [picture(1, 110, 84), picture(2, 64, 130)]
    ids, media = prompt_ids(qwen, "what <__media__> is <__media__> this?", images)
    assert [m.grid for m in media] == [(3, 3), (2, 4)]
    expect, expect_logits = reference(qwen[1], ids, images)
    tokens, logits = greedy(engine, ids, media, N_NEW)
    engine.memory.seq_rm(0)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4
    other_ids, other_media = prompt_ids(qwen, "what <__media__> is <__media__> this?", [images[0], images[0]])
    _, other = greedy(engine, other_ids, other_media, 1)
    engine.memory.seq_rm(0)
    assert (other[0] - expect_logits[0]).abs().max() > 1e-2  # the answer depends on the images


def test_an_image_after_a_cached_prefix(qwen, engine):
    """The hybrid memory holds the text before the image; the image and the rest run on."""
    image = picture(4, 80, 110)
    ids, media = prompt_ids(qwen, "a question before the picture: <__media__> and after", [image])
    expect, expect_logits = reference(qwen[1], ids, [image])
    engine.memory.seq_rm(1)
    head = media[0].start - 3
    engine.add_sequence(ids[:head], SamplingParams(temperature=0.0, max_tokens=1), 1)
    while engine.has_work:
        engine.step()
    tokens, logits = greedy(engine, ids, media, N_NEW, seq_id=1, n_cached=head)
    engine.memory.seq_rm(1)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_the_moe_variant_matches_transformers(tmp_path):
    folder = tmp_path / "moe"
    model, tok = make_qwen3_5_vl(folder, moe=True)
    image = picture(3, 96, 70)
    ids, media = prompt_ids((folder, model, tok), "see <__media__> here", [image])
    expect, expect_logits = reference(model, ids, [image])
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    assert engine.model_config.architecture == "Qwen3_5MoeForConditionalGeneration"
    tokens, logits = greedy(engine, ids, media, N_NEW)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_a_gguf_with_its_mmproj_answers_as_the_folder(qwen, tmp_path):
    """The converter's qwen35 language model (its M-RoPE sections in
    ``rope.dimension_sections``) and its qwen3vl_merger projector (the fused q/k/v, the
    two halves of the patch embedding, the position table): the folder's tokens."""
    model, mmproj = convert_pair(qwen[0], qwen[0], tmp_path, ("--no-mtp",))
    images = [picture(4, 60, 90), picture(5, 110, 110)]
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=512, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(qwen[0]), n_ctx=512, n_seq_max=1)
    assert from_gguf.model_config.architecture == "Qwen3_5ForConditionalGeneration"
    assert from_gguf.model.visual.config == from_folder.model.visual.config
    ids, media = engine_prompt(from_gguf, None, "<__media__> and <__media__>?", images, (4, 16))
    expect_ids, expect_media = engine_prompt(from_folder, qwen[0], "<__media__> and <__media__>?", images)
    assert ids == expect_ids and [m.grid for m in media] == [m.grid for m in expect_media] == [(2, 3), (3, 3)]
    tokens, logits = greedy(from_gguf, ids, media, N_NEW)
    expect, expect_logits = greedy(from_folder, ids, expect_media, N_NEW)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def chat_ids(qwen, messages: list[dict], images: list) -> list[int]:
    """The prompt transformers gives: Qwen3.5's template rendered by the tokenizer, each
    ``<|image_pad|>`` expanded to its image's count from the image processor (the
    processor's rule)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(qwen[0] / "tokenizer.json"))
    text = tok.apply_chat_template(messages, chat_template=template_text(), add_generation_prompt=True, tokenize=False)
    _, grid = transformers_pixels(images)
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(images) + 1
    counts = [int(g.prod()) // 4 for g in grid]
    text = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:]))
    return qwen[2].encode(text).ids


@pytest.fixture(scope="module")
def server(qwen, tmp_path_factory):
    from server_proc import ServerProcess

    slots = str(tmp_path_factory.mktemp("slots"))
    flags = ("-np", "2", "-c", "2048", "--slot-save-path", slots)
    with ServerProcess("-m", str(qwen[0]), *flags) as srv:
        srv.wait_ready()
        yield srv


def test_the_chat_route_answers_as_transformers_does(qwen, server):
    """Two images through the openai client with Qwen3.5's template: the prompt is the
    processor's, the answer transformers' greedy tokens and log probabilities; the
    same request again reuses both images from the slot."""
    from openai import OpenAI

    images = [picture(6, 90, 60), picture(7, 60, 120)]
    content = [{"type": "text", "text": "compare "}, image_part(images[0]), {"type": "text", "text": " with "},
               image_part(images[1])]  # fmt: skip
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    messages = [{"role": "user", "content": content}]
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=N_NEW, temperature=0,
                                            logprobs=True)  # fmt: skip
    plain = [{"type": "text", "text": "compare "}, {"type": "image"}, {"type": "text", "text": " with "},
             {"type": "image"}]  # fmt: skip
    ids = chat_ids(qwen, [{"role": "user", "content": plain}], images)
    expect, expect_logits = reference(qwen[1], ids, images)
    assert answer.usage.prompt_tokens == len(ids)
    got = [t.logprob for t in answer.choices[0].logprobs.content]
    want = expect_logits.log_softmax(-1).gather(1, torch.tensor(expect)[:, None])[:, 0].tolist()
    assert got == pytest.approx(want[: len(got)], abs=1e-4)
    image_end = max(i for i, t in enumerate(ids) if t == qwen[1].config.image_token_id) + 1
    again = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= image_end


def test_a_restored_slot_continues_the_conversation_as_transformers_does(qwen, server):
    """The slot that answered about an image is saved, erased and restored (the Gated
    DeltaNet states with the attention KV); the next turn reuses the image and answers
    as transformers does on the whole conversation."""
    from vision_tools import restored_turn

    image = picture(9, 84, 112)
    said, answer = restored_turn(server.url, image, "qwen35.slot", N_NEW, 10)
    plain = [{"type": "text", "text": "look: "}, {"type": "image"}]
    turns = [{"role": "user", "content": plain}, {"role": "assistant", "content": said},
             {"role": "user", "content": "why?"}]  # fmt: skip
    ids = chat_ids(qwen, turns, [image])
    expect, expect_logits = reference(qwen[1], ids, [image])
    assert answer.usage.prompt_tokens == len(ids)
    image_end = max(i for i, t in enumerate(ids) if t == qwen[1].config.image_token_id) + 1
    assert answer.usage.prompt_tokens_details.cached_tokens >= image_end
    said = answer.choices[0].message.model_extra.get("reasoning_content")  # the template opened <think>
    assert said == qwen[2].decode(expect[: answer.usage.completion_tokens])
