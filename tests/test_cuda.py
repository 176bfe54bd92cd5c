"""On a CUDA device (skipped without one; bench/gpu_check.sh runs them on the GPU machine):
greedy tokens against transformers in bfloat16, captured graphs against eager steps, a
slot file from the GPU continued on the CPU and back."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint
from test_static_decode import staggered

from engine import Engine, SamplingParams
from engine.slot_files import SlotFiles

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

N_STEPS = 32
# bfloat16 keeps 8 bits of mantissa: a logit of magnitude m is rounded by up to m / 256 in
# the LM head's output alone, and each layer rounds its activations again. Ours and
# transformers' logits may differ by TOL x (1 + the largest |logit|); a token may differ
# from transformers' choice only where the two were within that of each other (a tie).
TOL = 0.05


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    wide = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32)
    return {
        "llama": make_checkpoint(root / "llama", "llama", **wide),
        "qwen2": make_checkpoint(root / "qwen2", "qwen2", **wide),  # q/k/v biases
        "qwen3": make_checkpoint(root / "qwen3", "qwen3", **wide),  # q/k norms
    }


def with_logits(engine: Engine, prompts: list[list[int]], n: int) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy ``n`` tokens for each prompt, batched -> (tokens, logits [n, V]) each."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seqs = [engine.add_sequence(p, params, i) for i, p in enumerate(prompts)]
    logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(prompts))}
    while engine.has_work:
        for event in engine.step(keep_logits=True):
            if event.token_id is not None:
                logits[event.seq.seq_id].append(event.logits.float().cpu())
    return [(s.output_ids, torch.stack(logits[i])) for i, s in enumerate(seqs)]


@pytest.mark.parametrize("unified", [False, True], ids=["stream", "unified"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_match_transformers_in_bfloat16(folders, arch, unified):
    import transformers

    folder = folders[arch]
    engine = Engine.from_pretrained(str(folder), n_ctx=2048, n_seq_max=4, kv_unified=unified, device="cuda")
    assert engine.config.dtype == "bfloat16" and engine.static is not None and engine.static.graphs is not None
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    prompts = [list(range(3, 40)), [7, 8, 9], list(range(100, 300, 3))]
    worst = 0.0
    for prompt, (tokens, ours) in zip(prompts, with_logits(engine, prompts, N_STEPS)):
        assert len(tokens) == N_STEPS
        with torch.no_grad():  # transformers on our tokens (teacher forcing): its logits at each of our steps
            ref = hf(torch.tensor([prompt + tokens], device="cuda")).logits[0, len(prompt) - 1 : -1].float().cpu()
        tol = TOL * (1 + ref.abs().max().item())
        worst = max(worst, (ours - ref).abs().max().item() / (1 + ref.abs().max().item()))
        assert (ours - ref).abs().max() <= tol
        chosen = ref.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)  # [N]
        gap = ref.max(-1).values - chosen  # 0 where we chose transformers' argmax
        assert bool((gap <= tol).all()), f"steps where transformers preferred another token by more than {tol}: {gap}"
        assert (gap == 0).float().mean() >= 0.9  # ties are rare: nearly every step is its argmax itself
    print(f"{arch}: largest |ours - transformers| / (1 + max |logit|) = {worst:.4f} (TOL {TOL})")
    assert engine.static.n_replays > 0


def test_float32_greedy_tokens_are_transformers_generate(folders):
    """In float32 nothing rounds away a choice: the tokens are transformers' own generate."""
    import transformers

    folder = folders["llama"]
    engine = Engine.from_pretrained(str(folder), n_ctx=2048, n_seq_max=2, dtype="float32", device="cuda")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
    prompt = list(range(10, 50))
    ours = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=N_STEPS, ignore_eos=True))[0]
    out = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=N_STEPS, do_sample=False, pad_token_id=0)
    assert ours.token_ids == out[0, len(prompt) :].tolist()


def test_graphs_give_the_eager_steps_tokens_in_a_mixed_batch(folders):
    """float32: a captured graph runs Triton's small ops where the eager step runs
    torch's (engine/kernels/cuda_ops.py), and cuBLAS may pick other kernels under
    capture; in bfloat16 that rounding alone flips near-tied tokens of a random model."""
    runs = []
    for eager in (False, True):
        engine = Engine.from_pretrained(
            str(folders["llama"]), n_ctx=1024, n_seq_max=5, block_size=4, max_batch_tokens=8, device="cuda",
            dtype="float32", enforce_eager=eager,
        )  # fmt: skip
        assert (engine.static.graphs is None) == eager
        runs.append(staggered(engine))
        assert engine.static.n_replays == (0 if eager else engine.static.n_steps)
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] > 10


def _steps(engine: Engine, tokens: list[int], n_cached: int, params: SamplingParams) -> list[int]:
    seq = engine.add_sequence(tokens, params, 0, n_cached=n_cached)
    assert seq.n_computed == n_cached  # the slot's cache was used, not recomputed
    while engine.has_work:
        engine.step()
    return seq.output_ids


@pytest.mark.parametrize("unified", [False, True], ids=["stream", "unified"])
def test_a_slot_saved_on_the_gpu_continues_on_the_cpu_and_back(folders, tmp_path, unified):
    """float32 on both (a slot file is bound to its dtype): the continuation from a
    restored slot is the continuation the saving engine computes itself."""
    kw = dict(n_ctx=1024, n_seq_max=2, dtype="float32", kv_unified=unified)
    gpu = Engine.from_pretrained(str(folders["qwen2"]), device="cuda", **kw)
    cpu = Engine.from_pretrained(str(folders["qwen2"]), device="cpu", **kw)
    files = SlotFiles(tmp_path)
    first = _steps(gpu, list(range(20, 60)), 0, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    held = list(range(20, 60)) + first[:-1]  # the last token was sampled, not computed
    files.write("gpu.bin", held, gpu.memory.save_seq(0), gpu.fingerprint)

    file, _ = files.read("gpu.bin", cpu.fingerprint, cpu.model_config.vocab_size, 1024)
    cpu.memory.load_seq(0, file.state)
    on_cpu = _steps(cpu, held + [first[-1]], len(held), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    on_gpu = _steps(gpu, held + [first[-1]], len(held), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert on_cpu == on_gpu

    held2 = held + [first[-1]] + on_cpu[:-1]
    files.write("cpu.bin", held2, cpu.memory.save_seq(0), cpu.fingerprint)
    file, _ = files.read("cpu.bin", gpu.fingerprint, gpu.model_config.vocab_size, 1024)
    gpu.memory.seq_rm(0)
    gpu.memory.load_seq(0, file.state)
    back = _steps(gpu, held2 + [on_cpu[-1]], len(held2), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    mine = _steps(cpu, held2 + [on_cpu[-1]], len(held2), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert back == mine


SAMPLERS = [  # each row: the parameters of one sampled request (seeded: the draw is a pure function)
    dict(temperature=0.8),
    dict(temperature=0.9, top_k=12, top_p=0.8),
    dict(temperature=1.1, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2),
    dict(temperature=0.7, typical_p=0.6, top_n_sigma=1.5),
    dict(temperature=1.0, xtc_probability=0.9, xtc_threshold=0.05),
    dict(temperature=1.2, dynatemp_range=0.5),
    dict(temperature=0.9, mirostat=2),
    dict(temperature=0.9, mirostat=1),
    dict(temperature=0.0, logit_bias={3: 5.0}),
    dict(temperature=0.8, dry_multiplier=0.8, logprobs=3),
]


def test_sampling_on_the_device_draws_the_cpus_tokens():
    """Every stage of the chain runs where the logits are: the same seeded draws from the
    same logits on CUDA as on the CPU (float32: the same order and probabilities)."""
    from engine.sampling.sampler import SampleRow, sample

    gen = torch.Generator().manual_seed(0)
    history = [5, 6, 7, 5, 6, 7, 5, 6]
    for step in range(6):
        logits = torch.randn(len(SAMPLERS), 300, generator=gen) * 3  # [R, V]
        rows = [
            SampleRow(SamplingParams(seed=100 + i, **kw), 100 + i, [1, 2, 3], history + [step] * step)
            for i, kw in enumerate(SAMPLERS)
        ]
        on_cpu, on_gpu = sample(logits.clone(), rows), sample(logits.cuda(), rows)
        assert on_gpu.tokens == on_cpu.tokens
        assert on_gpu.logprobs == pytest.approx(on_cpu.logprobs, abs=1e-4)
