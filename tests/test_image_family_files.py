"""Image families from files shaped as users' (tests/image_family_files.py): the folder,
and the GGUF with its ``--mmproj`` projector the pinned converter writes from it, are
served; a turn with an image answers as transformers on the folder (its prompt is the
family's template rendered by transformers and expanded by the family's processor,
token for token; the same greedy tokens, and log probabilities where the route gives
them), the next turn reuses the image from the slot's cache, and a slot saved, erased
and restored answers that turn again the same. A family with a chat template that
takes images is served by the chat route, one without by llama-server's /completion
with ``multimodal_data``."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import pytest
import torch
from image_family_files import IMAGE_FAMILIES, build, convert
from server_proc import ServerProcess
from vision_tools import image_part, picture, qwen_reference

N_NEW = 6
IMAGE = picture(11, 84, 112)
FIRST = [{"role": "user", "content": [{"type": "text", "text": "What is in "}, {"type": "image"},
                                      {"type": "text", "text": " here?"}]}]  # fmt: skip
TURNS = FIRST + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "Why?"}]
FIRST_TEXT = "What is in <__media__> here? It is"  # /completion's prompts
NEXT_TEXT = FIRST_TEXT + " a picture. Why?"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[Path, Path, Path]]:
    """family -> (folder, model GGUF, projector GGUF)."""
    from gguf_tools import converter_tree
    from unavailable import unavailable

    try:
        converter_tree()
    except RuntimeError as exc:
        unavailable(f"llama.cpp's converter, the GGUF oracle, cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")
    root = tmp_path_factory.mktemp("image-families")
    folders = {name: build(root / name, name) for name in IMAGE_FAMILIES}
    files = convert({name: f for name, f in folders.items() if IMAGE_FAMILIES[name].gguf}, root)
    return {name: (folder, *files.get(name, (None, None))) for name, folder in folders.items()}


def transformers_turn(folder: Path, name: str, turn: list[dict] | str) -> tuple[list[int], list[int], torch.Tensor]:
    """The prompt transformers gives for ``turn`` (chat messages rendered by the folder's
    template, or /completion's text with the family's image marker), expanded by the
    family's processor (Qwen3.5: each ``<|image_pad|>`` repeated to the image
    processor's count, the processor's rule); its greedy tokens and logits [N_NEW, V]."""
    import transformers

    fam = IMAGE_FAMILIES[name]
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    if isinstance(turn, str):
        text = turn.replace("<__media__>", fam.marker)
    else:
        text = tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    if fam.processor is not None:
        inputs = transformers.AutoProcessor.from_pretrained(folder)(text=text, images=[IMAGE], return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=N_NEW, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
        return ids, out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]
    if fam.expansion == "smolvlm":
        return smolvlm_turn(folder, model, tok, text)
    pixels = transformers.AutoImageProcessor.from_pretrained(folder)(images=[IMAGE], return_tensors="pt")
    grid = pixels["image_grid_thw"]
    before, after = text.split("<|image_pad|>")
    ids = tok.encode(before + "<|image_pad|>" * (int(grid[0].prod()) // 4) + after, add_special_tokens=False)
    with torch.no_grad():
        tokens, logits = qwen_reference(model, ids, pixels["pixel_values"], grid, N_NEW)
    return ids, tokens, logits


def smolvlm_turn(folder: Path, model, tok, text: str) -> tuple[list[int], list[int], torch.Tensor]:
    """SmolVLMProcessor's rule: the image's tiles and the whole image from the image
    processor, ``<image>`` replaced by the prompt string for its rows and columns."""
    import transformers
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    pixels = transformers.AutoImageProcessor.from_pretrained(folder)(
        images=[[IMAGE]], return_tensors="pt", return_row_col_info=True
    )
    vision = model.config.vision_config
    per_frame = (vision.image_size // vision.patch_size) ** 2 // model.config.scale_factor**2
    rows, cols = pixels["rows"][0][0], pixels["cols"][0][0]
    image = get_image_prompt_string(rows, cols, per_frame, "<fake_token_around_image>", "<image>", "<global-img>")
    ids = tok.encode(text.replace("<image>", image))
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), pixel_values=pixels["pixel_values"], max_new_tokens=N_NEW,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))  # fmt: skip
    return ids, out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]


def image_end(folder: Path, ids: list[int]) -> int:
    """Where the last image token of ``ids`` ends."""
    import json

    config = json.loads((folder / "config.json").read_text())
    image = config.get("image_token_id", config.get("image_token_index"))
    return max(i for i, t in enumerate(ids) if t == image) + 1


def chat(url: str, turn: list[dict] | str) -> dict:
    """A greedy turn in slot 0: chat messages (the image as a data: URL, with log
    probabilities) or /completion's text (the image as ``multimodal_data``, with the
    tokens), as ``{"tokens", "logprobs", "n_prompt", "n_cached"}``."""
    if isinstance(turn, str):
        png = io.BytesIO()
        IMAGE.save(png, format="PNG")
        prompt = {"prompt_string": turn, "multimodal_data": [base64.b64encode(png.getvalue()).decode()]}
        body = {"prompt": prompt, "n_predict": N_NEW, "temperature": 0, "return_tokens": True, "id_slot": 0}
        answer = httpx.post(url + "/completion", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        done = answer.json()
        return {"tokens": done["tokens"], "logprobs": None, "n_prompt": done["tokens_evaluated"],
                "n_cached": done["timings"]["cache_n"]}  # fmt: skip
    sent = [{**m, "content": [image_part(IMAGE) if p["type"] == "image" else p for p in m["content"]]}
            if isinstance(m["content"], list) else m for m in turn]  # fmt: skip
    body = {"messages": sent, "max_tokens": N_NEW, "temperature": 0, "logprobs": True, "id_slot": 0}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    done = answer.json()
    return {"tokens": None, "logprobs": [t["logprob"] for t in done["choices"][0]["logprobs"]["content"]],
            "n_prompt": done["usage"]["prompt_tokens"],
            "n_cached": done["usage"]["prompt_tokens_details"]["cached_tokens"]}  # fmt: skip


def assert_as_transformers(answer: dict, ids: list[int], tokens: list[int], logits: torch.Tensor) -> None:
    assert answer["n_prompt"] == len(ids)
    if answer["tokens"] is not None:
        assert answer["tokens"] == tokens
    else:
        want = logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        assert 0 < len(answer["logprobs"]) <= N_NEW
        assert answer["logprobs"] == pytest.approx(want[: len(answer["logprobs"])], abs=1e-4)


SERVED = [(name, src) for name, fam in sorted(IMAGE_FAMILIES.items()) for src in ("folder", "gguf")[: 1 + fam.gguf]]


@pytest.mark.parametrize("name,source", SERVED)
def test_an_image_family_served_answers_as_transformers_and_restores_its_slot(files, tmp_path, name, source):
    folder, model, mmproj = files[name]
    first, turns = (FIRST, TURNS) if IMAGE_FAMILIES[name].text.template else (FIRST_TEXT, NEXT_TEXT)
    args = ("-m", str(folder)) if source == "folder" else ("-m", str(model), "--mmproj", str(mmproj))
    saves = tmp_path / "slots"
    saves.mkdir()
    first_want = transformers_turn(folder, name, first)
    ids, tokens, logits = transformers_turn(folder, name, turns)
    end = image_end(folder, ids)
    with ServerProcess(*args, "-np", "2", "-c", "2048", "--slot-save-path", str(saves)) as srv:
        srv.wait_ready()
        assert_as_transformers(chat(srv.url, first), *first_want)
        second = chat(srv.url, turns)
        assert_as_transformers(second, ids, tokens, logits)
        assert second["n_cached"] >= end  # the image from the slot
        for action in ("save", "erase", "restore"):
            body = {"filename": f"{name}.slot"} if action != "erase" else {}
            done = httpx.post(f"{srv.url}/slots/0?action={action}", json=body)
            assert done.status_code == 200, done.text
        again = chat(srv.url, turns)
        assert again["n_cached"] >= end
        assert again["tokens"] == second["tokens"] and again["logprobs"] == second["logprobs"]
