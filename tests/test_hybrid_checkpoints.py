"""Hybrid checkpoints laid out as their publishers ship them (issue 52), against
transformers on the same folder: greedy tokens identical, logits within 1e-4."""

from __future__ import annotations

import json

import torch
from checkpoints import (
    NEMOTRON_H_TINY,
    greedy_reference,
    make_checkpoint,
    make_published_gemma4,
    make_published_qwen3_5_moe,
)

from engine import Engine, SamplingParams


def test_a_published_qwen3_5_moe_folder_serves_its_text_as_transformers(tmp_path):
    """The multimodal folder, experts stacked, an MTP head, no layer list: the language
    model loads (vision and MTP tensors skipped, experts split) and answers as
    transformers' multimodal model does on text."""
    import transformers

    folder = make_published_qwen3_5_moe(tmp_path / "q")
    ref = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    assert [s.kind for s in engine.model.layer_specs(torch.float32)] == ["recurrent", "attention_full"] * 2
    assert_answers_as(engine, ref)


def test_a_published_gemma4_folder_serves_its_text_as_transformers(tmp_path):
    """Gemma 4's multimodal folder with the full layers' shape in ``global_head_dim`` /
    ``num_global_key_value_heads``: the text model, KV sharing and experts included."""
    import transformers

    folder = make_published_gemma4(tmp_path / "g")
    ref = transformers.Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1)
    widths = [getattr(s, "head_dim", None) for s in engine.model.layer_specs(torch.float32)]
    assert widths == [16, 16, 32, 16, None, None]  # the wide full layer; the last two reuse layers 3 and 2
    assert_answers_as(engine, ref)


def assert_answers_as(engine: Engine, ref) -> None:
    prompt = torch.randint(1, 300, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), seq_id=0)
    logits = []
    while engine.has_work:
        logits += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
    tokens, ref_logits = greedy_reference(ref, prompt, 16)
    assert seq.output_ids == tokens
    torch.testing.assert_close(torch.stack(logits), ref_logits.float(), atol=1e-4, rtol=0)


def test_an_older_nemotron_h_config_with_a_pattern_string_loads_the_same_model(tmp_path):
    """Nemotron-H hub configs before transformers 5 spell the blocks as
    ``hybrid_override_pattern`` ("M" Mamba2, "E" experts, "*" attention, "-" MLP) with
    ``num_hidden_layers``; transformers 5 writes ``layers_block_type`` alone."""
    folder = make_checkpoint(tmp_path / "n", "nemotron_h", **NEMOTRON_H_TINY)
    prompt = torch.randint(1, 300, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def answer() -> list[int]:
        engine = Engine.from_pretrained(str(folder), n_ctx=128, n_seq_max=1)
        return engine.generate([prompt], params)[0].token_ids, engine

    new, _ = answer()
    config = json.loads((folder / "config.json").read_text())
    assert "num_hidden_layers" not in config
    config["hybrid_override_pattern"] = "ME*-ME"
    config["num_hidden_layers"] = len(config.pop("layers_block_type"))
    (folder / "config.json").write_text(json.dumps(config))
    old, engine = answer()
    assert old == new
    assert [s.kind for s in engine.model.layer_specs(torch.float32)] == ["recurrent", "attention_full", "recurrent"]
