"""Images in the prompt, in the engine (issue 38, first step): a tiny random Gemma 3
vision-language checkpoint built by transformers is the oracle. Greedy tokens identical
and logits within 1e-4 in float32, for one image, two images, and an image after a
cached prefix; the image's tokens attend to each other both ways (transformers'
``token_type_ids`` mask), so a chunk never cuts an image."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_gemma3_vision, write_byte_tokenizer
from vision_tools import greedy

from engine import Engine, SamplingParams
from engine.core.media import MediaItem, split_point

IMAGE, BOI, EOI = 300, 301, 302
PER_IMAGE = 4  # tokens one image takes in the prompt (mm_tokens_per_image)
N_NEW = 12


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3") / "m"
    model = make_gemma3_vision(folder, IMAGE, BOI, EOI, PER_IMAGE)
    write_byte_tokenizer(folder)
    return folder, model


def prompt(*parts) -> tuple[list[int], list[int]]:
    """Text parts (lists of ids) and images (None) -> (ids, each image's first placeholder)."""
    ids, starts = [], []
    for part in parts:
        if part is None:
            ids.append(BOI)
            starts.append(len(ids))
            ids += [IMAGE] * PER_IMAGE + [EOI]
        else:
            ids += part
    return ids, starts


def reference(model, ids: list[int], pixels: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation (tokens, logits [N_NEW, V]), image tokens marked
    in token_type_ids (what its processor does: the bidirectional mask)."""
    input_ids = torch.tensor([ids])
    out = model.generate(
        input_ids, pixel_values=pixels, token_type_ids=(input_ids == IMAGE).long(), max_new_tokens=N_NEW,
        do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        attention_mask=torch.ones_like(input_ids),
    )  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]


def ours(engine: Engine, ids, starts, pixels, seq_id: int = 0, n_cached: int = 0) -> tuple[list[int], torch.Tensor]:
    media = [MediaItem.image(s, PER_IMAGE, p) for s, p in zip(starts, pixels)]
    return greedy(engine, ids, media, N_NEW, seq_id, n_cached)


@pytest.fixture(scope="module")
def engine(gemma3):
    return Engine.from_pretrained(str(gemma3[0]), n_ctx=512, n_seq_max=2, max_batch_tokens=6)


def test_one_image_matches_transformers(gemma3, engine):
    ids, starts = prompt(list(range(10, 16)), None, list(range(20, 31)))  # past the window of 8
    pixels = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    expect, expect_logits = reference(gemma3[1], ids, pixels)
    tokens, logits = ours(engine, ids, starts, pixels)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_two_images_match_transformers(gemma3, engine):
    ids, starts = prompt([40, 41], None, [42, 43, 44], None, [45])
    pixels = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(2))
    expect, expect_logits = reference(gemma3[1], ids, pixels)
    engine.memory.seq_rm(0)
    tokens, logits = ours(engine, ids, starts, pixels)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_an_image_after_a_cached_prefix(gemma3, engine):
    """The text before the image is cached by an earlier request, and two of the image's
    placeholders too (as plain tokens): a cached prefix that ends inside an image falls
    back to the image's start, so the image is computed whole on top of the text."""
    head = list(range(50, 59))
    ids, starts = prompt(head, None, [60, 61])
    pixels = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(3))
    expect, expect_logits = reference(gemma3[1], ids, pixels)
    engine.memory.seq_rm(1)
    engine.add_sequence(ids[: starts[0] + 3], SamplingParams(temperature=0.0, max_tokens=1), 1)
    while engine.has_work:
        engine.step()
    assert engine.memory.seq_pos_max(1) == starts[0] + 2  # the cache ends inside the image
    tokens, logits = ours(engine, ids, starts, pixels, seq_id=1, n_cached=starts[0] + 3)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


def test_the_image_block_is_bidirectional(gemma3, engine):
    """Without transformers' token_type_ids the image is causal: a different answer (so the
    comparisons above do test the bidirectional mask)."""
    ids, starts = prompt([7, 8], None, [9])
    pixels = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(4))
    causal = gemma3[1](torch.tensor([ids]), pixel_values=pixels).logits[0, -1]
    both_ways = gemma3[1](torch.tensor([ids]), pixel_values=pixels, token_type_ids=torch.tensor([ids]).eq(IMAGE).long())
    engine.memory.seq_rm(0)
    _, logits = ours(engine, ids, starts, pixels)
    assert (logits[0] - both_ways.logits[0, -1]).abs().max() < 1e-4
    assert (causal - both_ways.logits[0, -1]).abs().max() > 1e-3


def test_a_chunk_never_cuts_an_image():
    item = MediaItem(start=4, n_tokens=4, digest="x", pixels=None, features=torch.zeros(4, 8))
    assert split_point([item], 0, 6) == 4  # ends before the image
    assert split_point([item], 4, 2) == 4  # starts it: the whole image, past the budget
    assert split_point([item], 0, 8) == 8  # holds it whole
    assert split_point([item], 8, 3) == 3  # after it
    pending = MediaItem(start=4, n_tokens=4, digest="y", pixels=torch.zeros(3, 2, 2))  # not encoded yet
    assert split_point([pending], 0, 8) == 4  # the text before it only
    assert split_point([pending], 4, 8) == 0  # nothing: the chunk would start with it
    assert split_point([pending], 8, 3) == 3


def test_images_on_a_text_model_are_refused(tmp_path):
    from checkpoints import make_checkpoint

    engine = Engine.from_pretrained(str(make_checkpoint(tmp_path / "m", "llama")), n_ctx=128)
    with pytest.raises(ValueError, match="takes no images"):
        engine.add_sequence([1, 2, 3, 4], SamplingParams(), 0, media=[MediaItem(1, 2, "x", torch.zeros(3, 2, 2))])


def test_preprocessing_gives_transformers_pixels():
    """engine/text/images.py against transformers' PIL image processor for Gemma 3, on an
    image of another size and shape than the encoder's sent as PNG bytes, and on
    llama.cpp's multimodal test photo sent as its JPEG bytes."""
    import io

    import numpy as np
    from gguf_tools import MTMD_PHOTO, converter_tree
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from engine.text.images import ImageSettings, decode_image, pixels

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8))
    png = io.BytesIO()
    image.save(png, format="PNG")
    jpeg = (converter_tree() / MTMD_PHOTO).read_bytes()
    for data, size in ((png.getvalue(), 28), (jpeg, 896)):  # 896: Gemma 3's releases
        processor = Gemma3ImageProcessorPil(
            size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        expect = processor(images=Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"][0]  # [3, s, s]
        got = pixels(decode_image(data), ImageSettings(size, size))
        assert got.shape == expect.shape and (got - expect).abs().max() < 1e-6


def test_bytes_that_are_no_image_are_refused():
    from engine.text.images import BadImage, decode_image

    with pytest.raises(BadImage, match="not an image"):
        decode_image(b"GIF89a but not really")


def test_a_sequence_with_an_image_ends_at_its_context_instead_of_shifting(gemma3):
    """--context-shift does not move a sequence with images (a cut could halve one): it
    ends with "length" where its context is full, as without the flag; a text sequence
    beside it shifts and goes on."""
    engine = Engine.from_pretrained(
        str(gemma3[0]), n_ctx=64, n_seq_max=2, context_shift=True, swa_full=True, kv_unified=False
    )  # a stream of 32 cells each
    ids, starts = prompt([5, 6], None, [7])
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    image = [MediaItem.image(starts[0], PER_IMAGE, torch.zeros(3, 28, 28))]
    with_image = engine.add_sequence(ids, params, 0, media=image)
    text = engine.add_sequence([5, 6, 7, 8], params, 1)
    while engine.has_work:
        assert all(e.error is None for e in engine.step())
    assert with_image.finish_reason.value == "length" and len(with_image.tokens) == engine.n_ctx_seq
    assert len(text.output_ids) == 60 and text.n_shifted > 0


def test_an_image_is_encoded_in_pieces_while_others_decode(gemma3, engine):
    """With an encoder budget of one stage a step, the image's three stages (embeddings,
    two layers and the projector) take three steps; the decoding sequence beside it gets
    a token in every one of them, and the image's answer is still transformers'."""
    engine.memory.seq_rm(0), engine.memory.seq_rm(1)
    talker = engine.add_sequence([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), 0)
    while not talker.output_ids:
        engine.step()
    ids, starts = prompt([70, 71], None, [72])
    pixels = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(6))
    expect, _ = reference(gemma3[1], ids, pixels)
    media = [MediaItem.image(starts[0], PER_IMAGE, pixels[0])]
    params = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
    budget, engine.encoder.chunk_flops = engine.encoder.chunk_flops, 1  # one stage a step
    try:
        seq = engine.add_sequence(ids, params, 1, media=media)
        stages = []
        while media[0].features is None:
            n = len(talker.output_ids)
            engine.step()
            stages.append(media[0].stage)
            assert len(talker.output_ids) == n + 1  # the talker's token came in this step too
        assert stages == [1, 2, 3]
        while engine.has_work:
            engine.step()
    finally:
        engine.encoder.chunk_flops = budget
    assert seq.output_ids == expect


def test_the_frames_of_all_pending_requests_are_bounded_together():
    """A request's budget bounds its own images; the process's pool bounds every pending
    request's frames together: past it, ImagesBusy (the server's 503), and the bytes
    come back when the frames are freed, however their request ended."""
    import gc

    from engine.text.images import FramePool, ImagesBusy

    pool = FramePool(nbytes=3 * 4 * 1024)
    first = [torch.zeros(1024), torch.zeros(1024)]  # 8 KiB
    pool.hold(first, "image 0")
    assert pool.held == 8 * 1024
    with pytest.raises(ImagesBusy, match="image 1: the server holds"):
        pool.hold([torch.zeros(2048)], "image 1")  # 8 KiB more: over the 12 KiB
    del first
    gc.collect()
    assert pool.held == 0
    pool.hold([torch.zeros(2048)], "image 1")  # fits now
