"""LoRA adapters in the engine (engine/loading/lora.py, engine/kernels/lora_linear.py):
sequences with the adapter at full scale, at half scale and without it share one batch,
and each one's greedy tokens and logits equal transformers' on PEFT's merged model (fp32);
an adapter that does not fit the model is refused naming what."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import greedy_reference, load_reference, make_adapter, make_checkpoint

from engine import Engine, SamplingParams
from engine.errors import CheckpointError

N = 16


def test_adapters_at_any_scale_share_a_batch_and_match_the_merged_model(tmp_path):
    folder = make_checkpoint(tmp_path / "base", "llama")
    full = make_adapter(folder, tmp_path / "lora", alpha=8.0)
    half = make_adapter(folder, tmp_path / "lora-half", alpha=4.0)  # the same pairs, half the scaling
    config = json.loads((tmp_path / "lora-half" / "adapter_config.json").read_text())
    assert config["lora_alpha"] == 4.0
    lora = (str(tmp_path / "lora"),)
    engine = Engine.from_pretrained(str(folder), n_seq_max=3, n_ctx=256, max_batch_tokens=24, lora=lora)
    base = load_reference(folder)
    prompt = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
    cases = [((1.0,), full), ((0.0,), base), ((0.5,), half)]
    seqs = [engine.add_sequence(prompt, params, seq_id=i, lora=scales) for i, (scales, _) in enumerate(cases)]
    logits: dict[int, list] = {i: [] for i in range(3)}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    for i, (scales, reference) in enumerate(cases):
        tokens, ref_logits = greedy_reference(reference, prompt, N)
        assert seqs[i].output_ids == tokens, scales
        torch.testing.assert_close(torch.stack(logits[i]), ref_logits.float(), atol=1e-4, rtol=0, msg=str(scales))
    assert seqs[0].output_ids != seqs[1].output_ids  # the adapter changes what is generated


def test_an_adapter_that_does_not_fit_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "base", "llama")
    other = make_checkpoint(tmp_path / "wide", "llama", hidden_size=96, num_attention_heads=6, head_dim=16)
    make_adapter(other, tmp_path / "lora", alpha=8.0)
    with pytest.raises(CheckpointError, match="do not fit"):
        Engine.from_pretrained(str(folder), n_seq_max=1, n_ctx=128, lora=(str(tmp_path / "lora"),))
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        Engine.from_pretrained(str(folder), n_seq_max=1, n_ctx=128, lora=(str(tmp_path),))
