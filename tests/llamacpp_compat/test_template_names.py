"""Every chat template name llama-server knows (--chat-template NAME) renders what
llama-server renders for it: tests/data/llama_templates.json holds llama-server's
renderings (its C++ formats, recorded by bench/llamacpp_tests/record_templates.py on
the demo model's GGUF), compared here through a real server's /apply-template for every
name, and the engine's renderer directly for every conversation."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_proc import InProcessServer

from engine.text.chat_template import ChatTemplate, builtin_names, resolve_template
from engine.text.llama_formats import FormattedTemplate

TABLE = json.loads((Path(__file__).parents[1] / "data" / "llama_templates.json").read_text())
NAMES = sorted(TABLE["renderings"])


def renderer(name: str):
    name, source = resolve_template(name)
    return FormattedTemplate(name) if source is None else ChatTemplate(source, {}, name)


def test_every_name_llama_server_knows_is_ours():
    assert len(NAMES) >= 54 and set(NAMES) <= set(builtin_names())


@pytest.mark.parametrize("name", NAMES)
def test_each_name_renders_as_llama_server(name):
    for key, messages in TABLE["conversations"].items():
        assert renderer(name).render(messages, True) == TABLE["renderings"][name][key], key


@pytest.mark.parametrize("name", ["llama2", "gemma", "deepseek3", "gpt-oss", "chatml"])
def test_apply_template_on_a_server_gives_llama_servers_prompt(name):
    with InProcessServer(parallel=1, ctx_size=256, chat_template=name) as srv:
        for key, messages in TABLE["conversations"].items():
            prompt = httpx.post(srv.url + "/apply-template", json={"messages": messages}, timeout=60).json()["prompt"]
            assert prompt == TABLE["renderings"][name][key], key


WITH_BOS = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


@pytest.mark.parametrize("template", [WITH_BOS, "llama2"])
def test_a_model_that_adds_bos_gets_exactly_one(tmp_path, template):
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "spm", "llama", tokenizer="spm", vocab_size=1000)
    with InProcessServer(model=folder, parallel=1, ctx_size=256, chat_template=template) as srv:
        messages = TABLE["conversations"]["system"]
        prompt = httpx.post(srv.url + "/apply-template", json={"messages": messages}).json()["prompt"]
        assert not prompt.startswith("<s>")  # the rendered prompt carries no BOS text
        counted = httpx.post(srv.url + "/v1/chat/completions/input_tokens", json={"messages": messages}).json()
        pieces = httpx.post(srv.url + "/tokenize", json={"content": prompt, "add_special": True, "with_pieces": True})
        pieces = [p["piece"] for p in pieces.json()["tokens"]]
        assert counted["input_tokens"] == len(pieces) and pieces[0] == "<s>" and pieces[1] != "<s>"
