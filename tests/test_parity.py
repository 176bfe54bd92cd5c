"""Greedy tokens and logits match transformers on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch
from checkpoints import GEMMA3N_TINY, GEMMA4_TINY, greedy_reference, load_reference, make_checkpoint

from engine import Engine, SamplingParams

N_STEPS = 32
CASES = {
    "llama": ("llama", {}),
    "llama-llama3-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama-linear-tied": (
        "llama",
        {
            "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
            "tie_word_embeddings": True,
            "attention_bias": True,
        },
    ),
    "llama-yarn": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            }
        },
    ),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {}),
    "mistral-swa": ("mistral", {"sliding_window": 8}),  # every layer windowed; prompts up to 75 + 32 tokens
    "gemma2": (  # alternating local / global layers, soft-capped scores and logits
        "gemma2",
        {"num_hidden_layers": 4, "sliding_window": 8, "query_pre_attn_scalar": 24},
    ),
    "gemma3": (  # five local layers per global one, q/k norms, a rope per layer type
        "gemma3",
        {
            "num_hidden_layers": 6,
            "sliding_window": 16,
            "query_pre_attn_scalar": 16,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 4.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    ),
    "gemma3n": (  # AltUp, Laurel, per-layer inputs, sparse activations, per-layer FFN sizes, KV sharing
        "gemma3n",
        {**GEMMA3N_TINY, "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0], "intermediate_size": [128, 96, 128, 96]},
    ),
    "gemma4": ("gemma4", GEMMA4_TINY),  # wide full layers with k = v, proportional rope, KV sharing, MoE, PLE
    "gemma4-dense": (  # the large models' shape: no per-layer inputs, no sharing, no experts
        "gemma4",
        {
            **GEMMA4_TINY,
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "attention_k_eq_v": False,
            "enable_moe_block": False,
            "sliding_window": 16,
        },
    ),  # fmt: skip
}
WINDOWED = {"mistral-swa", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-dense"}
MODES = {"unified": dict(kv_unified=True), "stream": dict(kv_unified=False), "swa-full": dict(swa_full=True)}
RUNS = [(case, mode) for case in CASES for mode in MODES if mode != "swa-full" or case in WINDOWED]


@pytest.mark.parametrize("case,mode", RUNS)
def test_batched_greedy_matches_transformers(tmp_path, case, mode):
    arch, overrides = CASES[case]
    folder = make_checkpoint(tmp_path / case, arch, **overrides)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (1, 7, 30, 75)]
    # a small token budget forces chunked prefill mixed with decode steps
    kw = dict(n_ctx=512, n_seq_max=4, max_batch_tokens=40, block_size=8, **MODES[mode])
    engine = Engine.from_pretrained(str(folder), **kw)
    params = SamplingParams(temperature=0.0, max_tokens=N_STEPS, ignore_eos=True)
    # slots out of order: decode groups are first scattered streams ({0, 2}), then a run of all four
    seqs = [engine.add_sequence(p, params, seq_id=slot) for slot, p in zip((2, 0, 3, 1), prompts)]
    logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(4)}
    n_forwards = 0
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
        n_forwards += 1
    assert n_forwards < 4 * (N_STEPS + 3)  # sequences really ran together
    ref_model = load_reference(folder)
    for i, prompt in enumerate(prompts):
        ref_tokens, ref_logits = greedy_reference(ref_model, prompt, N_STEPS)
        assert seqs[i].output_ids == ref_tokens, f"prompt {i}"
        assert len(logits[i]) == N_STEPS
        for step, (ours, theirs) in enumerate(zip(logits[i], ref_logits)):
            torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=0, msg=f"prompt {i} step {step}")
    engine.memory.integrity_check()


@pytest.mark.parametrize("case,holes", [("llama", (3, 11)), ("llama", ()), ("gemma3", (3, 11))])
def test_wide_decode_batches_match_transformers(tmp_path, case, holes):
    """18 sequences decode together (decode attention puts each KV head's query heads
    in one SDPA row block), on scattered streams (``holes``: unused slots between them,
    read through a copy) and on a run of streams (read in place)."""
    n_seqs, n_steps = 18, 12
    arch, overrides = CASES[case]
    folder = make_checkpoint(tmp_path / case, arch, **overrides)
    gen = torch.Generator().manual_seed(2)
    # ids from 1: the reference's generate() takes token 0 (its pad id) in a prompt for padding
    prompts = [torch.randint(1, 300, (int(n),), generator=gen).tolist() for n in torch.randint(1, 40, (n_seqs,))]
    n_slots = n_seqs + len(holes)
    engine = Engine.from_pretrained(str(folder), n_ctx=64 * n_slots, n_seq_max=n_slots, block_size=8, kv_unified=False)
    params = SamplingParams(temperature=0.0, max_tokens=n_steps, ignore_eos=True)
    slots = [s for s in range(n_slots) if s not in holes]
    seqs = [engine.add_sequence(p, params, seq_id=slot) for slot, p in zip(slots, prompts)]
    logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(n_seqs)}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    ref_model = load_reference(folder)
    for i, prompt in enumerate(prompts):
        ref_tokens, ref_logits = greedy_reference(ref_model, prompt, n_steps)
        assert seqs[i].output_ids == ref_tokens, f"prompt {i}"
        for step, (ours, theirs) in enumerate(zip(logits[i], ref_logits)):
            torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=0, msg=f"prompt {i} step {step}")
