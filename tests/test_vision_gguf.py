"""A Gemma 3 vision-language model as llama.cpp runs it: the language model as a GGUF and
the encoder as a separate projector file (``convert_hf_to_gguf.py --mmproj``), loaded
with ``mmproj`` (the server's -mm/--mmproj). The oracle is the same checkpoint as a
Hugging Face folder, run by slotserve (itself held to transformers by tests/test_vision.py):
the same greedy tokens for an image prompt. The converter stores the projection matrix
in float16 (llama.cpp's choice), so logits agree to float16's rounding, not float32's."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import make_gemma3_vision, write_spm_tokenizer
from gguf_tools import _run_converters

from engine import Engine, SamplingParams
from engine.core.media import MediaItem
from engine.errors import CheckpointError

PER_IMAGE = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The checkpoint laid out as Gemma 3's releases are (the encoder under
    vision_tower.vision_model., a preprocessor_config.json), and its two GGUFs."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("gemma3-gguf")
    folder = root / "hf"
    folder.mkdir()
    layers = ["sliding_attention"] * 5 + ["full_attention"]  # what a GGUF says: every 6th layer global
    make_gemma3_vision(
        folder, 300, 301, 302, PER_IMAGE, vocab_size=1000, num_hidden_layers=6, layer_types=layers,
        query_pre_attn_scalar=16,  # = head_dim, as Gemma 3's releases (a GGUF derives it so)
    )  # fmt: skip
    write_spm_tokenizer(folder, 1000)
    weights = load_file(folder / "model.safetensors")
    moved = {
        ("vision_tower.vision_model." + k[13:] if k.startswith("vision_tower.") else k): v for k, v in weights.items()
    }
    save_file(moved, folder / "model.safetensors", metadata={"format": "pt"})
    processor = {"image_processor_type": "Gemma3ImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                 "size": {"height": 28, "width": 28}, "image_seq_length": PER_IMAGE, "resample": 2,
                 "rescale_factor": 1 / 255, "do_normalize": True, "do_rescale": True, "do_resize": True}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    model, mmproj = root / "model.gguf", root / "mmproj.gguf"
    _run_converters([[
        ("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", str(folder)]),
        ("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", str(folder)]),
    ]])  # fmt: skip
    return folder, model, mmproj


def greedy(engine: Engine, pixels: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of text, an image (the engine's own placeholder id), text; and the
    first token's logits."""
    spec = engine.model_config.media
    ids = [5, 6, 7, 8] + [spec.image_token_id] * PER_IMAGE + [9, 10]
    seq = engine.add_sequence(ids, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), 0,
                              media=[MediaItem.image(4, PER_IMAGE, pixels)])  # fmt: skip
    first = engine.step(keep_logits=True)[0].logits
    while engine.has_work:
        engine.step()
    engine.memory.seq_rm(0)
    return seq.output_ids, first


def test_a_gguf_with_its_mmproj_answers_as_the_folder(files):
    folder, model, mmproj = files
    pixels = torch.randn(3, 28, 28, generator=torch.Generator().manual_seed(5))
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=256, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    assert from_gguf.model_config.media.tokens_per_image == PER_IMAGE
    image = from_gguf.model.encode_images(pixels[None])
    assert (image - from_folder.model.encode_images(pixels[None])).abs().max() < 1e-2  # float16 projection
    tokens, logits = greedy(from_gguf, pixels)
    expect, expect_logits = greedy(from_folder, pixels)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-2
    _, other = greedy(from_folder, torch.randn(3, 28, 28, generator=torch.Generator().manual_seed(6)))
    assert (other - expect_logits).abs().max() > 0.1  # the answer depends on the image


def test_a_projector_without_a_gguf_model_or_of_another_kind_is_refused(files, tmp_path):
    folder, model, mmproj = files
    with pytest.raises(CheckpointError, match="goes with a GGUF model"):
        Engine.from_pretrained(str(folder), mmproj=str(mmproj), n_ctx=256)
    with pytest.raises(CheckpointError, match="not served"):
        Engine.from_pretrained(str(model), mmproj=str(model), n_ctx=256)  # a language model, no projector


def test_the_server_takes_mmproj(files):
    """``slotserve serve -m model.gguf --mmproj mmproj.gguf`` (llama-server's flags): /props
    says the model takes images, and a chat message with an image is answered."""
    import base64
    import io

    import httpx
    import numpy as np
    from PIL import Image
    from server_proc import ServerProcess

    _, model, mmproj = files
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8))
    png = io.BytesIO()
    image.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    with ServerProcess(
        "-m", str(model), "--mmproj", str(mmproj), "-np", "1", "-c", "256", "--no-mmproj-offload"
    ) as srv:
        srv.wait_ready()
        assert httpx.get(srv.url + "/props").json()["modalities"]["vision"] is True
        content = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > PER_IMAGE


@pytest.fixture(scope="module")
def smol_files(tmp_path_factory):
    """A SmolVLM as llama.cpp serves it: the projector converted from the SmolVLM folder
    (``--mmproj``), the language model from the same weights as a Llama folder (the
    converter takes SmolVLM's language model as the Llama it is); a SentencePiece
    tokenizer that knows SmolVLM's image tokens."""
    from checkpoints import SMOLVLM_TOKENS, make_smolvlm
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("smolvlm-gguf")
    folder, llama = root / "hf", root / "llama"
    make_smolvlm(folder, vocab_size=1000)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    write_spm_tokenizer(folder, 1000, tuple(SMOLVLM_TOKENS))
    config = json.loads((folder / "config.json").read_text())
    config["image_token_id"] = json.loads((folder / "added_tokens.json").read_text())["<image>"]  # the new vocabulary's
    (folder / "config.json").write_text(json.dumps(config))
    llama.mkdir()
    weights = load_file(folder / "model.safetensors")
    text = {
        k.replace("model.text_model.", "model."): v
        for k, v in weights.items()
        if not k.startswith(("model.vision", "model.connector"))
    }
    save_file(text, llama / "model.safetensors", metadata={"format": "pt"})
    (llama / "config.json").write_text(json.dumps(config["text_config"] | {"architectures": ["LlamaForCausalLM"]}))
    for name in (
        "tokenizer.model",
        "tokenizer.json",
        "tokenizer_config.json",
        "added_tokens.json",
        "special_tokens_map.json",
    ):
        if (folder / name).exists():
            (llama / name).write_bytes((folder / name).read_bytes())
    model, mmproj = root / "model.gguf", root / "mmproj.gguf"
    _run_converters([[
        ("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", str(llama)]),
        ("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", str(folder)]),
    ]])  # fmt: skip
    return folder, model, mmproj


def smol_greedy(engine: Engine, folder, image) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of a prompt with a tiled image (frames and text by the checkpoint's
    own layout), their logits and the image's frame count."""
    from engine.text.image_prompts import expand, image_prompts
    from engine.text.images import placeholder_starts

    cfg = engine.model_config
    layout = image_prompts(cfg.model_type, folder, engine.tokenizer.hf, cfg.media)
    text, frames = expand(layout, "look <__media__> now", [image], "<__media__>")
    ids = engine.tokenizer.encode(text, add_special=True)
    starts = placeholder_starts(ids, cfg.media.image_token_id, [cfg.media.tokens_per_image] * len(frames))
    media = [MediaItem.image(s, cfg.media.tokens_per_image, f) for s, f in zip(starts, frames)]
    seq = engine.add_sequence(ids, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), 0, media=media)
    logits = []
    while engine.has_work:
        logits += [e.logits for e in engine.step(keep_logits=True) if e.token_id is not None]
    engine.memory.seq_rm(0)
    return seq.output_ids, torch.stack(logits), len(frames)


def test_a_smolvlm_gguf_with_its_mmproj_answers_as_the_folder(smol_files):
    """The idefics3 projector: SigLIP and the pixel shuffle's matrix from the file, the
    tiling from its preprocessing size; the same frames, tokens and (float32) logits."""
    import numpy as np
    from PIL import Image

    folder, model, mmproj = smol_files
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (33, 41, 3), dtype=np.uint8))
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=512, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=1)
    assert from_gguf.model_config.architecture == "SmolVLMForConditionalGeneration"
    tokens, logits, n_frames = smol_greedy(from_gguf, None, image)
    expect, expect_logits, expect_frames = smol_greedy(from_folder, folder, image)
    assert n_frames == expect_frames == 5  # 2 x 2 tiles and the whole image
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4


@pytest.fixture(scope="module")
def qwen_files(tmp_path_factory):
    """A Qwen2.5-VL converted by llama.cpp's converter: the language model (GGUF arch
    qwen2vl, its M-RoPE sections) and the projector (qwen2.5vl_merger), from one folder
    whose windows are llama.cpp's 112 pixels (the file keeps no window size)."""
    from checkpoints import make_qwen2_5_vl

    root = tmp_path_factory.mktemp("qwen-gguf")
    folder = root / "hf"
    make_qwen2_5_vl(folder, window=112)
    model, mmproj = root / "model.gguf", root / "mmproj.gguf"
    _run_converters([[
        ("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", str(folder)]),
        ("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", str(folder)]),
    ]])  # fmt: skip
    return folder, model, mmproj


def qwen_greedy(engine: Engine, folder, images) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits for two images of other sizes (the layout of the
    checkpoint, its pixel budget the folder's: 4 to 16 tokens an image)."""
    from engine.text.image_prompts import expand, image_prompts
    from engine.text.images import placeholder_starts

    cfg = engine.model_config
    layout = image_prompts(cfg.model_type, folder, engine.tokenizer.hf, cfg.media, (4, 16))
    text, frames = expand(layout, "<__media__> and <__media__>?", images, "<__media__>")
    ids = engine.tokenizer.encode(text, add_special=True)
    shapes = [layout.placeholders(f) for f in frames]
    starts = placeholder_starts(ids, cfg.media.image_token_id, [n for n, _ in shapes])
    media = [MediaItem.image(s, n, f, grid) for s, (n, grid), f in zip(starts, shapes, frames)]
    seq = engine.add_sequence(ids, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), 0, media=media)
    logits = []
    while engine.has_work:
        logits += [e.logits for e in engine.step(keep_logits=True) if e.token_id is not None]
    engine.memory.seq_rm(0)
    return seq.output_ids, torch.stack(logits)


def test_a_qwen2_5_vl_gguf_with_its_mmproj_answers_as_the_folder(qwen_files):
    """The qwen2vl language model keeps its M-RoPE sections; the qwen2.5vl_merger projector
    gives back the fused q/k/v, the 3-D patch embedding and the block pattern."""
    import numpy as np
    from PIL import Image

    folder, model, mmproj = qwen_files
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((60, 90, 3), (110, 110, 3))]
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=512, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=1)
    assert from_gguf.model_config.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert from_gguf.model.sections == from_folder.model.sections == [2, 3, 3]
    assert from_gguf.model.visual.config == from_folder.model.visual.config
    tokens, logits = qwen_greedy(from_gguf, None, images)
    expect, expect_logits = qwen_greedy(from_folder, folder, images)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4
