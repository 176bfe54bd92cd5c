"""Speculative decoding with a draft model (engine/core/draft_model.py): tokens and
logits the same as plain decoding whether the draft is always right or mostly wrong,
with slots used again, and a draft whose vocabulary is not the target's refused."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("draft") / "llama", "llama")


@pytest.fixture(scope="module")
def other(folder, tmp_path_factory):
    """The target with noise on every weight (the same tokenizer): a draft that is
    right about half the time."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("spec") / "other"
    shutil.copytree(folder, out)
    gen = torch.Generator().manual_seed(7)
    weights = load_file(out / "model.safetensors")
    noisy = {k: w + 0.15 * w.std() * torch.randn(w.shape, generator=gen) for k, w in weights.items()}
    save_file(noisy, out / "model.safetensors", metadata={"format": "pt"})
    return out


def with_draft(folder, draft, prompts, params, **config):
    engine = Engine.from_pretrained(
        str(folder), n_ctx=1024, n_seq_max=2, block_size=8, model_draft=str(draft), spec_p_min=0.0, **config
    )
    out = []
    for start in range(0, len(prompts), 2):  # the slots are used again: the draft's memory follows them
        seqs = [
            engine.add_sequence(p, q, seq_id=i)
            for i, (p, q) in enumerate(zip(prompts[start : start + 2], params[start : start + 2]))
        ]
        steps = {s: [] for s in seqs}
        while engine.has_work:
            for ev in engine.step(keep_logits=True):
                steps[ev.seq].append(ev.logits)
        out += [(s, steps[s]) for s in seqs]
    engine.memory.integrity_check()
    return out


@pytest.mark.parametrize("draft", ["itself", "other"])
def test_a_draft_model_changes_no_token(folder, other, draft):
    """Greedy and seeded requests give the plain run's tokens and logits with a draft
    model proposing, whether it is always right (the target itself) or mostly wrong;
    the slots are used twice, so the draft's memory must follow what they hold."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 300, (n,), generator=gen).tolist() for n in (9, 30, 17, 5)]
    prompts[2] = prompts[0] + prompts[2]  # shares a prefix with what the slot held
    params = [
        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=4, max_tokens=25, ignore_eos=True, logprobs=1),
    ] * 2
    plain = [
        (s, steps) for s, steps in with_draft(folder, folder, prompts, params, spec_draft_max=0)
    ]  # a draft of no tokens: plain decoding
    fast = with_draft(folder, folder if draft == "itself" else other, prompts, params, spec_draft_max=5)
    for (a, a_logits), (b, b_logits) in zip(plain, fast):
        assert a.output_ids == b.output_ids
        assert len(a_logits) == len(b_logits)
        for x, y in zip(a_logits, b_logits):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
    assert all(a.n_drafted == 0 for a, _ in plain)
    drafted, accepted = sum(b.n_drafted for b, _ in fast), sum(b.n_draft_accepted for b, _ in fast)
    if draft == "itself":  # greedy rows take every proposal
        assert all(b.n_draft_accepted == b.n_drafted > 0 for b, _ in fast if b.params.greedy)
    else:
        assert 0 < accepted < drafted


def test_a_draft_model_must_share_the_vocabulary(folder, tmp_path):
    import shutil

    swapped = tmp_path / "swapped"  # the same sizes, two tokens' ids exchanged
    shutil.copytree(folder, swapped)
    spec = json.loads((swapped / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (swapped / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="draft model .*tokenizer is not the target's"):
        Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1, model_draft=str(swapped))
    bigger = make_checkpoint(tmp_path / "bigger", "llama", vocab_size=1000, tokenizer="spm")
    with pytest.raises(ValueError, match="draft model .*vocabulary of 1000 tokens, the target has 320"):
        Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1, model_draft=str(bigger))
    with pytest.raises(ValueError, match="draft-simple goes with a draft model"):
        Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=1, spec_type="draft-simple")
