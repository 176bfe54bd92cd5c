"""Image prompts are the processor's (issue 51, item 6): for every image model slotserve
runs (Qwen2.5-VL, SmolVLM, Gemma 3), under the model's own chat template (tests/data:
Qwen2-VL's, SmolVLM's and Gemma 3's, as their repositories publish them), the chat
route's prompt ids equal those of transformers' processor (``apply_chat_template``,
tokenized, images expanded) for any arrangement of text and image parts: an image
first, last, between text parts, two images, text parts with spaces the template trims,
a system turn and a second user turn."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from checkpoints import make_gemma3_vision, make_qwen2_5_vl, make_smolvlm, write_vision_tokenizer
from server_proc import InProcessServer
from vision_tools import image_part, picture

DATA = Path(__file__).parent / "data"
IMAGES = [picture(6, 90, 60), picture(7, 60, 120)]


def text(t: str) -> dict:
    return {"type": "text", "text": t}


ARRANGEMENTS = {
    "image-last": [text("What is this?"), 0],
    "image-first": [0, text("Describe it.")],
    "between": [text("compare "), 0, text(" with "), 1],
    "spaced": [text("  A reminder.  "), text(" Look: "), 0, text("  and say why.  ")],
    "two-together": [0, 1, text("Which is brighter?")],
}


def _processor_without_videos(cls, **parts):
    """A transformers processor built without its video processor (which needs
    torchvision, absent here: images only go through it)."""
    from transformers.processing_utils import ProcessorMixin

    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None
    try:
        return cls(**parts)
    finally:
        ProcessorMixin.check_argument_for_proper_class = check


def _tokenizer(folder: Path, **specials):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), extra_special_tokens=specials)


def _parts(folder: Path, images_cls, template_file: str):
    """The checkpoint's image processor (its preprocessor_config.json) and a template."""
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config.pop("image_processor_type")
    return images_cls(**config), (DATA / template_file).read_text()


def qwen(root: Path):
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = root / "qwen"
    make_qwen2_5_vl(folder)
    images, template = _parts(folder, Qwen2VLImageProcessorPil, "qwen2_vl_chat_template.jinja")
    processor = _processor_without_videos(
        Qwen2_5_VLProcessor, image_processor=images, tokenizer=_tokenizer(folder),
        video_processor=None, chat_template=template,
    )  # fmt: skip
    return folder, template, processor


def smolvlm(root: Path):
    from transformers import SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    folder = root / "smolvlm"
    make_smolvlm(folder)
    images, template = _parts(folder, SmolVLMImageProcessorPil, "smolvlm_chat_template.jinja")
    processor = _processor_without_videos(
        SmolVLMProcessor, image_processor=images, tokenizer=_tokenizer(folder),
        video_processor=SimpleNamespace(num_frames=None, fps=None),  # read for defaults only
        chat_template=template, image_seq_len=4,
    )  # fmt: skip
    return folder, template, processor


def gemma3(root: Path):
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    folder = root / "gemma3"
    image, boi, eoi, vocab = write_vision_tokenizer(folder)
    make_gemma3_vision(
        folder, image, boi, eoi, 4, vocab_size=vocab, eos_token_id=None, bos_token_id=None, pad_token_id=0
    )
    template = (DATA / "gemma3_chat_template.jinja").read_text()
    tokenizer = _tokenizer(
        folder, boi_token="<start_of_image>", image_token="<image_soft_token>", eoi_token="<end_of_image>"
    )
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, chat_template=template, image_seq_length=4)
    return folder, template, processor


@pytest.fixture(scope="module", params=[qwen, smolvlm, gemma3], ids=["qwen2.5-vl", "smolvlm", "gemma3"])
def model(request, tmp_path_factory):
    folder, template, processor = request.param(tmp_path_factory.mktemp("image-prompts"))
    path = folder / "chat_template.jinja"
    path.write_text(template, encoding="utf-8")
    with InProcessServer(model=folder, ctx_size=4096, chat_template_file=path) as srv:
        yield srv, processor


def ids_of(srv, messages: list[dict]) -> list[int]:
    """The chat route's prompt ids for ``messages`` (OpenAI's parts, images as data: URLs)."""
    from server.pipeline.chat import chat_prompt
    from server.schemas.requests import ChatCompletionRequest

    body = ChatCompletionRequest(messages=messages)
    return asyncio.run(chat_prompt(srv.state, srv.state.require_ready(), body)).ids


def conversation(parts: list, images_as) -> list[dict]:
    content = [images_as(IMAGES[p]) if isinstance(p, int) else p for p in parts]
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize("arrangement", sorted(ARRANGEMENTS))
def test_the_prompt_is_the_processors(model, arrangement):
    srv, processor = model
    parts = ARRANGEMENTS[arrangement]
    theirs = processor.apply_chat_template(
        conversation(parts, lambda image: {"type": "image", "image": image}),
        add_generation_prompt=True, tokenize=True, return_dict=True,
    )["input_ids"][0]  # fmt: skip
    assert ids_of(srv, conversation(parts, image_part)) == list(theirs)


def test_a_system_turn_and_a_second_question_are_the_processors(model):
    srv, processor = model
    turns = [
        ("system", [text("Be brief.")]),
        ("user", [text("What is this? "), 0]),
        ("assistant", [text("A picture.")]),
        ("user", [text("And this one?"), 1]),
    ]

    def messages(images_as):
        return [{"role": role, "content": conversation(parts, images_as)[0]["content"]} for role, parts in turns]

    theirs = processor.apply_chat_template(
        messages(lambda image: {"type": "image", "image": image}),
        add_generation_prompt=True, tokenize=True, return_dict=True,
    )["input_ids"][0]  # fmt: skip
    assert ids_of(srv, messages(image_part)) == list(theirs)
