"""Every family the README names, from files shaped as users' (tests/family_files.py):
its prompt is the family's own template and tokenizer, token for token; the Hugging
Face folder and the GGUF the pinned converter writes from it answer as transformers
(greedy ids; logits within float32 noise); both are served over HTTP with a
multi-turn conversation reusing the slot's cache and a slot saved, erased and
restored."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from family_files import FAMILIES
from server_proc import ServerProcess

from engine import Engine, SamplingParams
from engine.loading.gguf.checkpoint import GGUFCheckpoint

NAMES = sorted(FAMILIES)
MESSAGES = [{"role": "user", "content": "Write a haiku about slots."}]
N_NEW = 8
CONVERTS_AS = {"mistral": ["LlamaForCausalLM"]}  # the converter writes Mistral's models as llama


@pytest.fixture(scope="module")
def files(family_files) -> dict[str, tuple[Path, Path]]:
    return family_files


def prompt_ids(folder: Path) -> list[int]:
    """The prompt as transformers renders and tokenizes it; a base model's (Mamba2,
    Jamba: no template) is the plain text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    if tok.chat_template is None:
        return tok.encode(MESSAGES[0]["content"])
    return list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))


def transformers_run(folder: Path, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the logits of every step [N_NEW, V]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=N_NEW,
                             min_new_tokens=N_NEW, do_sample=False, return_dict_in_generate=True,
                             output_logits=True)  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.cat(out.logits)


def engine_run(path: Path, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """slotserve's greedy tokens and the logits of every step [N_NEW, V]."""
    engine = Engine.from_pretrained(str(path), n_seq_max=1)
    engine.add_sequence(ids, SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True), seq_id=0)
    logits = []
    while engine.has_work:
        logits += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
    steps = torch.stack(logits)
    return steps.argmax(-1).tolist(), steps


@pytest.mark.parametrize("name", NAMES)
def test_the_prompt_is_the_familys_template_and_tokenizer(files, name):
    folder, gguf = files[name]
    want = prompt_ids(folder)
    for path in (folder, gguf):
        tok = Engine.from_pretrained(str(path), n_seq_max=1).tokenizer
        if FAMILIES[name].template is None:  # (served with llama-server's default template)
            assert tok.encode(MESSAGES[0]["content"]) == want
        else:
            text = tok.chat_template.render(MESSAGES, add_generation_prompt=True)
            assert tok.encode(text, add_special=not tok.adds_bos) == want, path.name


@pytest.mark.parametrize("name", NAMES)
def test_the_folder_and_its_gguf_answer_as_transformers(files, tmp_path, name):
    folder, gguf = files[name]
    arch = CONVERTS_AS.get(name) or json.loads((folder / "config.json").read_text())["architectures"]
    assert GGUFCheckpoint(gguf).hf_config()["architectures"] == arch
    ids = prompt_ids(folder)
    want, want_logits = transformers_run(folder, ids)
    got, logits = engine_run(folder, ids)
    assert got == want
    assert (logits - want_logits).abs().max() < 5e-4  # every step's, within float32 noise
    oracle = FAMILIES[name].as_file(folder, tmp_path / "as-file")  # what the file says, where it says less
    if oracle != folder:
        want, want_logits = transformers_run(oracle, ids)
    got, logits = engine_run(gguf, ids)
    assert got == want
    assert (logits - want_logits).abs().max() < 5e-4


@pytest.mark.parametrize("source", ["folder", "gguf"])
@pytest.mark.parametrize("name", NAMES)
def test_served_with_a_conversation_cached_and_its_slot_saved_and_restored(files, tmp_path, name, source):
    path = files[name][0 if source == "folder" else 1]
    saves = tmp_path / "slots"
    saves.mkdir()
    with ServerProcess("-m", str(path), "-np", "2", "-c", "4096", "--slot-save-path", str(saves)) as srv:
        srv.wait_ready()

        def chat(messages: list[dict]) -> dict:
            body = {"messages": messages, "max_tokens": 6, "temperature": 0, "id_slot": 0}
            answer = httpx.post(srv.url + "/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            return answer.json()

        first = chat(MESSAGES)
        turn = [*MESSAGES, {"role": "assistant", "content": first["choices"][0]["message"]["content"] or "ok"},
                {"role": "user", "content": "And one about caches?"}]  # fmt: skip
        second = chat(turn)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        for action in ("save", "erase", "restore"):
            body = {"filename": f"{name}.slot"} if action != "erase" else {}
            done = httpx.post(f"{srv.url}/slots/0?action={action}", json=body)
            assert done.status_code == 200, done.text
        assert (saves / f"{name}.slot").stat().st_size > 0
        again = chat(turn)  # from the restored slot
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert again["choices"][0]["message"] == second["choices"][0]["message"]


@pytest.mark.parametrize("name", ["granitemoehybrid", "falcon_h1"])
def test_the_hubs_spelling_of_the_config_answers_as_transformers_5s(files, name):
    """Granite 4.0's layer kinds as ``mamba`` / ``attention`` and Falcon-H1's ``head_dim``,
    as the hub's configs spell them (the GGUF's source, family_files.hub_spelling): the
    same model as the folder transformers 5 saved."""
    folder, _ = files[name]
    hub = folder.with_name(f"{name}-hub")
    assert (hub / "config.json").read_text() != (folder / "config.json").read_text()
    ids = prompt_ids(folder)
    want, want_logits = engine_run(folder, ids)
    got, logits = engine_run(hub, ids)
    assert got == want and torch.equal(logits, want_logits)
