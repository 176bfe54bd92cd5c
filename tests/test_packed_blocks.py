"""Rows repacked into 8-row groups at load (engine/kernels/csrc/packed_impl.inc, issue 36):
the packed layout holds exactly the file's values, and the integer kernel on it, on every
kernel unit this CPU runs, computes the exact dot product of each weight with the
activations rounded as llama.cpp rounds them (int8 blocks of 32 for Q4_0 and Q8_0, of
256 for the K-quants), up to float32 sums.
"""

from __future__ import annotations

import gguf
import pytest
import torch
from test_blocks import _blocks

from engine.kernels import blocks
from engine.kernels.block_model import pack_block_linears
from engine.kernels.blocks import PACKED, BlockEmbedding, BlockLinear, BlockWeight

T = gguf.GGMLQuantizationType
ORDER = sorted(PACKED, key=int)
pytestmark = pytest.mark.usefixtures("kernel_threads")  # rows split over threads


@pytest.fixture(scope="module")
def ext():
    if blocks.compiled_isa() is None:
        pytest.skip("the compiled kernels are not built: nothing is packed (test_blocks covers the torch path)")
    return blocks._blocks


def _k(qtype) -> int:
    return 512 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 352  # 2 super-blocks, or 11 blocks of 32


def llama_rounded(x: torch.Tensor, group: int) -> torch.Tensor:
    """[M, K] float64 -> the values llama.cpp's Q8_0 (group 32) / Q8_K (256) blocks stand for."""
    b = x.float().reshape(x.shape[0], -1, group)
    d = b.abs().amax(-1, keepdim=True) / 127  # float32, as the kernel: q = round(x * (1 / d))
    q = torch.where(d > 0, torch.round(b * torch.where(d > 0, 1 / d, 0)), 0)
    return (q.double() * d.double()).reshape(x.shape)


@pytest.mark.parametrize("qtype", ORDER, ids=lambda t: t.name)
def test_the_packed_layout_holds_exactly_the_files_values(ext, qtype):
    w, deq = _blocks(qtype, 24, _k(qtype), seed=5)  # an all-zero block, outliers, an all-positive block
    assert w.packable
    packed = w.pack()
    assert packed.packed and packed.shape == w.shape and packed.data.shape[0] == 3
    assert torch.equal(packed.dequantize(), deq)
    assert torch.equal(packed.dequantize(slice(8, 20)), deq[8:20])  # the groups the tiles take
    assert torch.equal(packed.dequantize(torch.tensor([23, 0, 9])), deq[[23, 0, 9]])
    assert packed.nbytes <= 1.03 * w.nbytes  # Q4_K's and Q5_K's 6-bit scales as bytes, IQ4_XS's in bytes
    with pytest.raises(ValueError, match="packed"):
        packed[torch.tensor([0])]


@pytest.mark.parametrize("qtype", ORDER, ids=lambda t: t.name)
def test_the_integer_kernel_is_exact_on_llama_cpps_rounding_on_every_unit(ext, qtype):
    k = _k(qtype)
    group = 256 if k == 512 else 32
    w, deq = _blocks(qtype, 40, k, seed=6)
    p = w.pack()
    for m in (1, 2, 5, 7, 13, 70):  # tiles of 6 (3 on AVX2), then 2, then 1; 70 crosses an L2 block
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
        x[0, :group] = 0  # an all-zero activation block (scale 0)
        exact = llama_rounded(x, group) @ deq.double().T  # [m, 40]
        slack = 2e-6 * (llama_rounded(x, group).abs() @ deq.double().abs().T) + 1e-6  # float32 sums
        plain = x.double() @ deq.double().T
        for unit in ext.isas():
            y = ext.packed_linear_on(x, [p.data], [int(qtype)], unit)  # [m, 40]
            err = (y.double() - exact).abs()
            assert bool((err <= slack).all()), f"{unit}, {m} rows: worst excess {(err - slack).max().item():.3g}"
        assert (y.double() - plain).abs().max() > 10 * slack.max()  # the rounding shows: the test can fail


def test_parts_of_both_activation_blocks_are_one_call(ext):
    """Q4_K and Q6_K (blocks of 256) beside Q8_0 and Q4_0 (blocks of 32): the activations
    rounded once per block size, each part exactly as alone."""
    parts = [_blocks(t, n, 512, seed=n)[0].pack() for t, n in [(T.Q4_K, 16), (T.Q8_0, 24), (T.Q6_K, 8), (T.Q4_0, 32)]]
    x = torch.randn(9, 512)
    fused = ext.packed_linear(x, [p.data for p in parts], [int(p.qtype) for p in parts])  # [9, 80]
    alone = torch.cat([ext.packed_linear(x, [p.data], [int(p.qtype)]) for p in parts], dim=-1)
    torch.testing.assert_close(fused, alone, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="packed weights"):
        ext.packed_linear(x, [parts[0].data], [int(T.Q6_K)])  # bytes that are not that type's groups


def test_a_layer_packs_only_when_every_part_can(ext):
    q4k, _ = _blocks(T.Q4_K, 16, 256, seed=1)
    q5k, _ = _blocks(T.Q3_K, 16, 256, seed=2)  # no packed layout (yet): the file's rows stay
    odd, _ = _blocks(T.Q8_0, 12, 256, seed=3)  # 12 rows: not whole groups of 8
    for kinds, packs in [([q4k, q4k], True), ([q4k, q5k], False), ([odd], False)]:
        layer = BlockLinear(256, [w.shape[0] for w in kinds])
        for i, w in enumerate(kinds):
            layer.set_part(i, w)
        x = torch.randn(3, 256)
        before = layer(x)
        assert (layer.pack() > 0) == packs and layer.packed == packs
        after = layer(x)  # [3, rows]: int8 activations once packed, 16-bit before; both near
        torch.testing.assert_close(after, before, rtol=0.05, atol=0.05 * before.abs().max().item())
        if packs:  # the tiles (long prefill chunks on AVX2-only CPUs) read the packed groups
            tiled = blocks.block_linear(x, layer.parts, compiled=False)
            torch.testing.assert_close(tiled, x @ torch.cat([w.dequantize() for w in kinds]).T, rtol=1e-5, atol=1e-4)


def test_a_head_tied_to_the_embedding_table_is_not_packed(ext):
    table, _ = _blocks(T.Q8_0, 64, 256, seed=4)
    model = torch.nn.Module()
    model.embed = BlockEmbedding(64, 256)
    model.embed.set_part(0, table)
    model.head = BlockLinear(256, [64])
    model.head.set_part(0, table)
    model.proj = BlockLinear(256, [64])
    model.proj.set_part(0, BlockWeight(T.Q8_0, table.data.clone(), 256))
    assert pack_block_linears(model) == (1, model.proj.weight_bytes)
    assert model.proj.packed and not model.head.packed and model.head.parts[0] is model.embed.table


def test_without_the_extension_nothing_is_packable(monkeypatch):
    w, _ = _blocks(T.Q4_K, 16, 256, seed=1)
    monkeypatch.setattr(blocks, "_blocks", None)
    assert not w.packable
    layer = BlockLinear(256, [16])
    layer.set_part(0, w)
    assert layer.pack() == 0 and not layer.packed


def test_the_repack_flags_are_llama_servers(monkeypatch):
    from server.cli import build_parser
    from server.config.flags import settings_from_args

    def parsed(*argv: str):
        return settings_from_args(build_parser().parse_args(["serve", *argv]))

    assert parsed().repack is True
    assert parsed("--no-repack").repack is False and parsed("-nr").repack is False
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")
    assert parsed().repack is False
    assert parsed("--repack").repack is True


def test_an_engine_repacks_at_load_unless_told_not_to(ext):
    from engine import DEMO_MODEL, Engine, SamplingParams

    prompt = [[5, 9, 100, 7, 3]]
    greedy = SamplingParams(max_tokens=6, temperature=0)
    packed = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=64, n_seq_max=1, quantization="q8_0")
    plain = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=64, n_seq_max=1, quantization="q8_0", repack=False)
    layers = [m for m in packed.model.modules() if isinstance(m, BlockLinear)]
    assert layers and all(m.packed for m in layers)
    assert not any(m.packed for m in plain.model.modules() if isinstance(m, BlockLinear))
    assert packed.fingerprint == plain.fingerprint  # slot files move between the two layouts
    a, b = packed.generate(prompt, greedy)[0], plain.generate(prompt, greedy)[0]
    assert len(a.token_ids) == len(b.token_ids) == 6
    assert weight_bytes(packed) == weight_bytes(plain)  # Q8_0 groups: the file's bytes, moved


def weight_bytes(engine) -> int:
    return sum(m.weight_bytes for m in engine.model.modules() if isinstance(m, BlockLinear))


WIDE_PROBE = """
import sys, torch
sys.path.insert(0, "tests")
from test_packed_blocks import _blocks, T
from engine.kernels import _blocks as ext
print(ext.wide())
for qtype, n in [(T.Q4_K, 40), (T.Q6_K, 24), (T.Q8_0, 16), (T.IQ4_XS, 8)]:
    k = 512
    p = _blocks(qtype, n, k, seed=n)[0].pack()
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(1))
    a = ext.packed_linear_on(x, [p.data], [int(qtype)], "avx512")
    b = ext.packed_linear_on(x, [p.data], [int(qtype)], "portable")
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-4), (qtype, (a - b).abs().max())
"""


@pytest.mark.parametrize("wide", ["0", "1"])
def test_the_avx512_unit_in_256_and_512_bit_tiles(ext, wide):
    """The AVX-512 unit takes two groups a 512-bit vector on Intel CPUs, one a 256-bit
    vector elsewhere (SLOTSERVE_WIDE overrides): both agree with the portable unit, odd
    group counts included (a pair, then one group)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if "avx512" not in ext.isas():
        pytest.skip("this CPU has no AVX-512 VNNI")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "SLOTSERVE_WIDE": wide}
    done = subprocess.run([sys.executable, "-c", WIDE_PROBE], env=env, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == ("True" if wide == "1" else "False")


def mixed_batch_logits(engine, n: int) -> list[torch.Tensor]:
    """Greedy logits [n, V] of a 5- and a 30-token prompt decoded together from slots 0
    and 1 (prefill chunks beside decode rows, with a small ``max_batch_tokens``)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    prompts = [[5, 9, 100, 7, 3], list(range(40, 70))]
    seqs = [engine.add_sequence(p, params, seq_id=i) for i, p in enumerate(prompts)]
    logits: list[list[torch.Tensor]] = [[], []]
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    return [torch.stack(rows) for rows in logits]


@pytest.mark.parametrize("layout", ["stream", "unified"])
@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_a_packed_layer_is_two_compiled_calls_and_the_eager_layer_bit_for_bit(ext, monkeypatch, layout, cache):
    """Layers whose projections are all packed run as layer_qkv + attention + layer_out:
    the same kernels in the same order as the eager layer, so the logits of a mixed batch
    (prefill chunks and decode rows, two sequences) are equal exactly."""
    from engine import DEMO_MODEL, Engine
    from engine.kernels import packed_layer

    calls = []
    qkv = ext.layer_qkv
    monkeypatch.setattr(ext, "layer_qkv", lambda *a: calls.append(a[0].shape[0]) or qkv(*a))

    def run() -> list[torch.Tensor]:
        engine = Engine.from_pretrained(
            str(DEMO_MODEL), n_ctx=256, n_seq_max=2, quantization="q8_0", kv_unified=layout == "unified",
            cache_type_k=cache, cache_type_v=cache, max_batch_tokens=16,
        )  # fmt: skip
        return mixed_batch_logits(engine, 8)

    fused = run()
    n_layers = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=16, n_seq_max=1).model_config.n_layers
    assert len(calls) >= 8 * n_layers and 1 in calls and max(calls) > 1  # decode rows and prefill chunks
    calls.clear()
    monkeypatch.setattr(packed_layer, "enabled", False)
    eager = run()
    assert not calls
    for a, b in zip(fused, eager):
        assert a.shape[0] == b.shape[0] == 8 and torch.equal(a, b)


BIASED_FAMILIES = {
    "qwen2": {},  # q/k/v biases, a dense MLP: layer_out
    "qwen2_moe": "QWEN2_MOE_TINY",  # q/k/v biases, experts and a gated shared expert after layer_attn_out
    "gpt_oss": "GPT_OSS_TINY",  # biases everywhere, sinks, sliding and full layers, clamped experts
}


@pytest.mark.parametrize("arch", list(BIASED_FAMILIES))
def test_layers_with_biases_sinks_or_experts_take_the_compiled_calls_bit_for_bit(ext, monkeypatch, tmp_path, arch):
    """The attention half of a layer with projection biases (Qwen2, gpt-oss) and sink
    logits (gpt-oss) runs as layer_qkv + attention; a gated MLP follows as layer_out, any
    other MLP (a mixture of experts) as layer_attn_out + the MLP module: the logits of a
    mixed batch are the eager layer's exactly, and the biases count."""
    import checkpoints

    from engine import Engine
    from engine.kernels import packed_layer

    extra = BIASED_FAMILIES[arch]
    folder = checkpoints.make_checkpoint(tmp_path / arch, arch, **(getattr(checkpoints, extra) if extra else {}))
    calls: dict[str, list[int]] = {"layer_qkv": [], "layer_out": [], "layer_attn_out": []}
    for name, seen in calls.items():
        original = getattr(ext, name)
        monkeypatch.setattr(ext, name, lambda *a, _f=original, _s=seen, **k: _s.append(a[0].shape[0]) or _f(*a, **k))

    def engine():
        return Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=2, quantization="q8_0", max_batch_tokens=16)

    built = engine()
    layer = built.model.model.layers[0]
    assert layer.self_attn.qkv_proj.packed and layer.self_attn.qkv_proj.bias is not None
    fused = mixed_batch_logits(built, 6)
    tail = "layer_out" if arch == "qwen2" else "layer_attn_out"
    n_layers = len(built.model.model.layers)
    assert len(calls["layer_qkv"]) == len(calls[tail]) >= 6 * n_layers  # every layer, every step
    assert 1 in calls[tail] and max(calls[tail]) > 1  # decode rows and prefill chunks
    monkeypatch.setattr(packed_layer, "enabled", False)
    for seen in calls.values():
        seen.clear()
    eager = mixed_batch_logits(engine(), 6)
    assert not any(calls.values())
    for a, b in zip(fused, eager):
        assert a.shape[0] == 6 and torch.equal(a, b)
    monkeypatch.setattr(packed_layer, "enabled", True)
    unbiased = engine()
    for layer in unbiased.model.model.layers:
        layer.self_attn.qkv_proj.bias.data.zero_()
    assert not torch.equal(mixed_batch_logits(unbiased, 6)[0], fused[0])  # the fused path adds the biases
