"""Hybrid checkpoints laid out as their publishers ship them (issue 52), against
transformers on the same folder: greedy tokens identical, logits within 1e-4."""

from __future__ import annotations

import torch
from checkpoints import greedy_reference, make_published_qwen3_5_moe

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
    prompt = torch.randint(1, 300, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), seq_id=0)
    logits = []
    while engine.has_work:
        logits += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
    tokens, ref_logits = greedy_reference(ref, prompt, 16)
    assert seq.output_ids == tokens
    torch.testing.assert_close(torch.stack(logits), ref_logits.float(), atol=1e-4, rtol=0)
