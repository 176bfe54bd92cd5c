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
from vision_tools import convert_pair, engine_prompt, greedy, picture

from engine import Engine
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
    return (folder, *convert_pair(folder, folder, root))


def gemma_greedy(engine: Engine, pixels: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of text, an image (the engine's own placeholder id), text; and the
    first token's logits."""
    spec = engine.model_config.media
    ids = [5, 6, 7, 8] + [spec.image_token_id] * PER_IMAGE + [9, 10]
    tokens, logits = greedy(engine, ids, [MediaItem.image(4, PER_IMAGE, pixels)], 12)
    engine.memory.seq_rm(0)
    return tokens, logits[0]


def test_a_gguf_with_its_mmproj_answers_as_the_folder(files):
    folder, model, mmproj = files
    pixels = torch.randn(3, 28, 28, generator=torch.Generator().manual_seed(5))
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=256, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    assert from_gguf.model_config.media.tokens_per_image == PER_IMAGE
    image = from_gguf.model.encode_images(pixels[None])
    assert (image - from_folder.model.encode_images(pixels[None])).abs().max() < 1e-2  # float16 projection
    tokens, logits = gemma_greedy(from_gguf, pixels)
    expect, expect_logits = gemma_greedy(from_folder, pixels)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-2
    _, other = gemma_greedy(from_folder, torch.randn(3, 28, 28, generator=torch.Generator().manual_seed(6)))
    assert (other - expect_logits).abs().max() > 0.1  # the answer depends on the image


def test_a_projector_without_a_gguf_model_or_of_another_kind_is_refused(files, tmp_path):
    folder, model, mmproj = files
    with pytest.raises(CheckpointError, match="goes with a GGUF model"):
        Engine.from_pretrained(str(folder), mmproj=str(mmproj), n_ctx=256)
    with pytest.raises(CheckpointError, match="not served"):
        Engine.from_pretrained(str(model), mmproj=str(model), n_ctx=256)  # a language model, no projector


def test_the_server_takes_mmproj(files, tmp_path):
    """``slotserve serve -m model.gguf --mmproj mmproj.gguf`` (llama-server's flags): /props
    says the model takes images, and a chat message with an image is answered. Its slot,
    saved with the image, is refused by the same model served without the projector,
    and that server's slot is left as it was."""
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
    slots = ("--slot-save-path", str(tmp_path))
    with ServerProcess(
        "-m", str(model), "--mmproj", str(mmproj), "-np", "1", "-c", "256", "--no-mmproj-offload", *slots
    ) as srv:
        srv.wait_ready()
        assert httpx.get(srv.url + "/props").json()["modalities"]["vision"] is True
        content = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > PER_IMAGE
        saved = httpx.post(srv.url + "/slots/0", params={"action": "save"}, json={"filename": "image.slot"})
        assert saved.status_code == 200, saved.text
    with ServerProcess("-m", str(model), "-np", "1", "-c", "256", *slots) as srv:  # no projector
        srv.wait_ready()
        body = {"prompt": "plain text", "n_predict": 2, "id_slot": 0}
        assert httpx.post(srv.url + "/completion", json=body).status_code == 200
        before = httpx.get(srv.url + "/slots").json()[0]
        r = httpx.post(srv.url + "/slots/0", params={"action": "restore"}, json={"filename": "image.slot"})
        assert r.status_code == 400, r.text
        assert httpx.get(srv.url + "/slots").json()[0]["n_cached"] == before["n_cached"] > 0


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
    spec = json.loads((folder / "tokenizer.json").read_text())
    ids = json.loads((folder / "added_tokens.json").read_text())
    known = {t["content"] for t in spec["added_tokens"]}
    spec["added_tokens"] += [  # SmolVLM's image markers are added tokens, as in its published tokenizer.json
        {"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for t in SMOLVLM_TOKENS if t not in known
    ]  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(spec))
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
    return (folder, *convert_pair(llama, folder, root))


def test_a_smolvlm_gguf_with_its_mmproj_answers_as_the_folder(smol_files):
    """The idefics3 projector: SigLIP and the pixel shuffle's matrix from the file, the
    tiling from its preprocessing size; the same frames, tokens and (float32) logits."""
    folder, model, mmproj = smol_files
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=512, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=1)
    assert from_gguf.model_config.architecture == "SmolVLMForConditionalGeneration"
    ids, media = engine_prompt(from_gguf, None, "look <__media__> now", [picture(3)])
    expect_ids, expect_media = engine_prompt(from_folder, folder, "look <__media__> now", [picture(3)])
    assert ids == expect_ids and len(media) == len(expect_media) == 5  # 2 x 2 tiles and the whole image
    tokens, logits = greedy(from_gguf, ids, media, 10)
    expect, expect_logits = greedy(from_folder, ids, expect_media, 10)
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
    return (folder, *convert_pair(folder, folder, root))


def test_a_qwen2_5_vl_gguf_with_its_mmproj_answers_as_the_folder(qwen_files):
    """The qwen2vl language model keeps its M-RoPE sections; the qwen2.5vl_merger projector
    gives back the fused q/k/v, the 3-D patch embedding and the block pattern; the pixel
    budget is the folder's (4 to 16 tokens an image: the file keeps none)."""
    folder, model, mmproj = qwen_files
    images = [picture(4, 60, 90), picture(5, 110, 110)]
    from_gguf = Engine.from_pretrained(str(model), mmproj=str(mmproj), n_ctx=512, n_seq_max=1)
    from_folder = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=1)
    assert from_gguf.model_config.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert from_gguf.model.sections == from_folder.model.sections == [2, 3, 3]
    assert from_gguf.model.visual.config == from_folder.model.visual.config
    ids, media = engine_prompt(from_gguf, None, "<__media__> and <__media__>?", images, (4, 16))
    expect_ids, expect_media = engine_prompt(from_folder, folder, "<__media__> and <__media__>?", images)
    assert ids == expect_ids and [m.grid for m in media] == [m.grid for m in expect_media]
    tokens, logits = greedy(from_gguf, ids, media, 10)
    expect, expect_logits = greedy(from_folder, ids, expect_media, 10)
    assert tokens == expect
    assert (logits - expect_logits).abs().max() < 1e-4
