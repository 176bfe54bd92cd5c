"""LoRA adapters in the engine (engine/loading/lora.py, engine/kernels/lora_linear.py):
sequences with the adapter at full scale, at half scale and without it share one batch,
and each one's greedy tokens and logits equal transformers' on PEFT's merged model (fp32);
the same for a GGUF LoRA written by llama.cpp's convert_lora_to_gguf.py on a GGUF base
written by its convert_hf_to_gguf.py; an adapter that does not fit the model is refused
naming what."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from checkpoints import greedy_reference, load_reference, make_adapter, make_checkpoint

from engine import Engine, SamplingParams
from engine.errors import CheckpointError

N = 16


def run_batch(engine: Engine, cases: list) -> None:
    """(scales, reference model) per sequence, all in one batch: each one's greedy tokens
    and logits equal the reference's."""
    prompt = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
    seqs = [engine.add_sequence(prompt, params, seq_id=i, lora=scales) for i, (scales, _) in enumerate(cases)]
    logits: dict[int, list] = {i: [] for i in range(len(cases))}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    for i, (scales, reference) in enumerate(cases):
        tokens, ref_logits = greedy_reference(reference, prompt, N)
        assert seqs[i].output_ids == tokens, scales
        torch.testing.assert_close(torch.stack(logits[i]), ref_logits.float(), atol=1e-4, rtol=0, msg=str(scales))
    assert seqs[0].output_ids != seqs[1].output_ids  # the adapter changes what is generated


def test_adapters_at_any_scale_share_a_batch_and_match_the_merged_model(tmp_path):
    folder = make_checkpoint(tmp_path / "base", "llama")
    full = make_adapter(folder, tmp_path / "lora", alpha=8.0)
    half = make_adapter(folder, tmp_path / "lora-half", alpha=4.0)  # the same pairs, half the scaling
    config = json.loads((tmp_path / "lora-half" / "adapter_config.json").read_text())
    assert config["lora_alpha"] == 4.0
    lora = (str(tmp_path / "lora"),)
    engine = Engine.from_pretrained(str(folder), n_seq_max=3, n_ctx=256, max_batch_tokens=24, lora=lora)
    run_batch(engine, [((1.0,), full), ((0.0,), load_reference(folder)), ((0.5,), half)])


def test_a_gguf_lora_on_a_gguf_model_matches_the_merged_model(gguf_lora):
    """llama's q/k rows, which the converter interleaves, come back in the adapter too."""
    folder, base_gguf, peft_folder, lora_gguf, merged = gguf_lora
    reader = gguf.GGUFReader(str(lora_gguf))
    assert reader.fields["general.type"].contents() == "adapter"
    lora = (str(lora_gguf), str(peft_folder))  # the same adapter as either file: ids 0 and 1
    engine = Engine.from_pretrained(str(base_gguf), n_seq_max=3, n_ctx=256, max_batch_tokens=24, lora=lora)
    base = load_reference(folder)
    run_batch(engine, [((1.0, 0.0), merged), ((0.0, 0.0), base), ((0.0, 1.0), merged)])


def _adapter_file(path, arch: str, tensors: dict, alora: list[int] | None = None):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    if alora:  # an activated LoRA's invocation tokens
        writer.add_array("adapter.alora.invocation_tokens", alora)
    writer.add_float32("adapter.lora.alpha", 8.0)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_a_gguf_that_is_no_lora_for_this_model_is_refused(gguf_lora, tmp_path):
    folder, base_gguf, *_ = gguf_lora
    a, b = np.zeros((4, 64), np.float32), np.zeros((64, 4), np.float32)
    pair = {"blk.0.attn_output.weight.lora_a": a, "blk.0.attn_output.weight.lora_b": b}
    cases = [
        (str(base_gguf), "not a LoRA adapter"),
        (_adapter_file(tmp_path / "qwen.gguf", "qwen2", pair), "a LoRA for 'qwen2' models"),
        (_adapter_file(tmp_path / "embd.gguf", "llama", {"token_embd.weight.lora_a": a}), "adapts no attention"),
        (_adapter_file(tmp_path / "half.gguf", "llama", {"blk.0.ffn_up.weight.lora_a": a}), "lora_a alone"),
        (_adapter_file(tmp_path / "alora.gguf", "llama", pair, alora=[5, 6]), "aLoRA"),
    ]
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message):
            Engine.from_pretrained(str(folder), n_seq_max=1, n_ctx=128, lora=(path,))


def test_an_adapter_that_does_not_fit_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "base", "llama")
    other = make_checkpoint(tmp_path / "wide", "llama", hidden_size=96, num_attention_heads=6, head_dim=16)
    make_adapter(other, tmp_path / "lora", alpha=8.0)
    with pytest.raises(CheckpointError, match="do not fit"):
        Engine.from_pretrained(str(folder), n_seq_max=1, n_ctx=128, lora=(str(tmp_path / "lora"),))
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        Engine.from_pretrained(str(folder), n_seq_max=1, n_ctx=128, lora=(str(tmp_path),))
