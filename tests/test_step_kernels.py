"""The compiled kernels of the decode step's small ops (engine/kernels/csrc:
attention_impl.inc, rope_impl.inc, mlp_impl.inc) against float64 references, on the AVX2 and the
portable units; and the engine's decode rows really attending through the kernel, with
torch's SDPA path (no extension) still matching transformers."""

from __future__ import annotations

import pytest
import torch
from checkpoints import GPT_OSS_TINY, greedy_reference, load_reference, make_checkpoint
from unavailable import unavailable

import memory
from engine import Engine, SamplingParams
from engine.kernels import blocks, rotary
from engine.models.rope import rotate
from memory.attention import kv_view
from memory.kv_codec import CODECS

FAR = 2**62
pytestmark = pytest.mark.usefixtures("kernel_threads")  # rows split over threads


@pytest.fixture(scope="module")
def compiled():
    if blocks.compiled_isa() is None:
        unavailable("the compiled kernels are not built (pip install -e . with a C++ compiler)", "SLOTSERVE_SKIP_EXT")
    return blocks._blocks


def reference_attention(q, k, v, kv_pos, q_pos, window, scale, softcap):
    """float64: q [B, H, D], k, v [B, KVH, L, D] -> [B, H, D]; a row that sees no key is 0."""
    groups = q.shape[1] // k.shape[1]
    seen = kv_pos <= q_pos[:, None]  # [B, L]
    if window > 0:
        seen &= kv_pos > q_pos[:, None] - window
    kk, vv = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)  # [B, H, L, D]
    s = torch.einsum("bhd,bhld->bhl", q.double(), kk) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~seen[:, None, :], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # [B, H, L]
    return torch.einsum("bhl,bhld->bhd", p, vv)


CASES = {  # (B, H, KVH, L, D, window, softcap)
    "gqa": (1, 12, 4, 192, 64, 0, 0.0),
    "mha-wide-head": (3, 8, 8, 50, 128, 0, 0.0),
    "window": (4, 8, 2, 300, 64, 37, 0.0),
    "softcap-one-kv-head": (2, 4, 1, 33, 256, 0, 50.0),
    "odd-head-dim": (2, 6, 3, 21, 40, 5, 0.0),  # D not a multiple of 32: the columns' tail
}


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("case", CASES)
def test_decode_attention_is_softmax_attention(compiled, case, any_cpu):
    b, h, kvh, n, d, window, softcap = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    cache_k, cache_v = (torch.randn(b + 2, kvh, n + 9, d, generator=gen) for _ in "kv")
    k, v = cache_k[1 : b + 1, :, :n], cache_v[1 : b + 1, :, :n]  # strided views, as a stream cache gives them
    q = torch.randn(b, h, d, generator=gen) * 3
    kv_pos = torch.randint(0, n, (b, n + 4), generator=gen)[:, :n]  # positions out of order, repeated
    kv_pos[:, -3:] = FAR + 1  # cells holding no key
    q_pos = torch.randint(n // 2, n, (b,), generator=gen)
    q_pos[-1] = -1  # a query that sees no key: zeros
    out = compiled.decode_attention(q, k, v, kv_pos, q_pos, window, d**-0.5, softcap, portable=any_cpu)
    expected = reference_attention(q, k, v, kv_pos, q_pos, window, d**-0.5, softcap)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert out[-1].abs().max() == 0


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("types", [("f16", "f16"), ("bf16", "q8_0"), ("q8_0", "q8_0"), ("q8_0", "f32")])
@pytest.mark.parametrize("case", ["gqa", "window", "odd-head-dim"])
def test_decode_attention_reads_the_stored_rows_as_stored(compiled, case, types, any_cpu):
    """Keys and values as a smaller cache stores them (kv_codec: f16, bf16, q8_0 rows)
    attend as the rows those codecs decode to: the kernel converts in registers."""
    b, h, kvh, n, d, window, softcap = CASES[case]
    if "q8_0" in types and d % 32:
        d = 64  # q8_0 rows hold whole blocks of 32
    gen = torch.Generator().manual_seed(7)
    k_codec, v_codec = (CODECS[t] for t in types)
    stored_k = k_codec.encode(torch.randn(b + 1, kvh, n + 5, d, generator=gen))
    stored_v = v_codec.encode(torch.randn(b + 1, kvh, n + 5, d, generator=gen))
    k, v = stored_k[1:, :, :n], stored_v[1:, :, :n]  # strided views of a stream cache
    q = torch.randn(b, h, d, generator=gen) * 3
    kv_pos = torch.randint(0, n, (b, n), generator=gen)
    q_pos = torch.randint(n // 2, n, (b,), generator=gen)
    out = compiled.decode_attention(q, k, v, kv_pos, q_pos, window, d**-0.5, softcap, portable=any_cpu)
    expected = reference_attention(q, k_codec.decode(k), v_codec.decode(v), kv_pos, q_pos, window, d**-0.5, softcap)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("case", ["gqa", "window", "softcap-one-kv-head"])
def test_rows_of_a_verify_step_attend_bit_for_bit_as_their_decode_steps(compiled, case, any_cpu):
    """``q_seq``: several query rows of one sequence (a speculation's verify step), each
    at its own position, against the sequence's keys, the later positions' keys already
    stored. Each row equals, bit for bit, the one-row call a decode step of that
    position makes (its keys then only up to its position); two sequences' rows mixed."""
    b, h, kvh, n, d, window, softcap = CASES[case]
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(2, kvh, n, d, generator=gen), torch.randn(2, kvh, n, d, generator=gen)
    kv_pos = torch.arange(n).repeat(2, 1)  # [2, L]
    seq = torch.tensor([0, 0, 0, 1, 1, 0])  # rows' sequences, interleaved
    q_pos = torch.tensor([n - 6, n - 5, n - 4, n - 2, n - 1, n - 3])
    q = torch.randn(len(seq), h, d, generator=gen)
    out = compiled.decode_attention(q, k, v, kv_pos, q_pos, window, d**-0.5, softcap, any_cpu, seq)
    for r in range(len(seq)):
        s, p = int(seq[r]), int(q_pos[r])
        alone = compiled.decode_attention(
            q[r : r + 1], k[s : s + 1, :, : p + 1], v[s : s + 1, :, : p + 1], kv_pos[s : s + 1, : p + 1],
            q_pos[r : r + 1], window, d**-0.5, softcap, portable=any_cpu,
        )  # fmt: skip
        assert torch.equal(out[r], alone[0])
    with pytest.raises(RuntimeError, match="q_seq"):
        compiled.decode_attention(q, k, v, kv_pos, q_pos, window, 1.0, 0.0, any_cpu, seq + 1)


def test_decode_attention_refuses_rows_it_cannot_read(compiled):
    q = torch.randn(1, 2, 40)
    k = CODECS["f16"].encode(torch.randn(1, 1, 3, 40))
    pos = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="q8_0"):  # 40 values are not whole q8_0 blocks
        compiled.decode_attention(
            q,
            k.view(torch.uint8)[..., :42],
            k.view(torch.uint8)[..., :42],
            pos,
            torch.zeros(1, dtype=torch.long),
            0,
            1.0,
            0.0,
        )
    with pytest.raises(RuntimeError, match="float32, float16, bfloat16 or q8_0"):
        compiled.decode_attention(q, k.double(), k.double(), pos, torch.zeros(1, dtype=torch.long), 0, 1.0, 0.0)


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_kv_store_writes_what_the_codec_encodes_bit_for_bit(compiled, kind, any_cpu):
    codec = CODECS[kind]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, 64, generator=gen) * torch.tensor([1e-6, 1.0, 300.0, 7e4, 0.0, 1e-30])[:, None, None]
    x[5, 1, :7] = torch.tensor([0.5, 1.5, 2.5, -2.5, 65519.0, 65520.0, 6e-8])  # ties, the edge of float16
    cache = torch.zeros(40, codec.width(64), dtype=codec.storage)
    rows = torch.randperm(40, generator=gen)[:18]
    compiled.kv_store(cache, rows, x, portable=any_cpu)
    expected = torch.zeros_like(cache).index_copy_(0, rows, codec.encode(x).reshape(18, -1))
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))


def test_kv_store_refuses_rows_outside_the_cache(compiled):
    cache = torch.zeros(4, 8)
    with pytest.raises(RuntimeError, match="outside"):
        compiled.kv_store(cache, torch.tensor([1, 4]), torch.ones(2, 8))
    assert cache.abs().sum() == 0  # checked before anything is written


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
def test_rope_is_rotate_half(compiled, any_cpu):
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(5, 20, 64, generator=gen)
    x = qkv[:, :16]  # q and k heads of a fused projection: rows 20 heads apart
    cos, sin = torch.randn(5, 1, 64, generator=gen), torch.randn(5, 1, 64, generator=gen)
    x64, half = x.double(), 32
    rolled = torch.cat([x64[..., half:], x64[..., :half]], dim=-1)  # roll by D/2: the signed sin does the rest
    expected = x64 * cos.double() + rolled * sin.double()
    torch.testing.assert_close(compiled.rope(x, cos, sin, portable=any_cpu).double(), expected, atol=1e-6, rtol=1e-6)


def test_rotate_takes_the_compiled_call_only_where_it_can(compiled, monkeypatch):
    x, cos, sin = torch.randn(3, 4, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    fused = rotary.fused_rotate(x, cos, sin)
    assert fused is not None
    torch.testing.assert_close(rotate(x, cos, sin), fused, rtol=0, atol=0)
    assert rotary.fused_rotate(x.bfloat16(), cos, sin) is None  # float32 only
    assert rotary.fused_rotate(x, cos[:1], sin[:1]) is None  # one cos/sin row per token only
    monkeypatch.setattr(rotary, "_blocks", None)
    torch.testing.assert_close(rotate(x, cos, sin), fused, atol=1e-6, rtol=1e-6)  # torch's three ops


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
def test_silu_mul_is_the_gated_activation(compiled, any_cpu):
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(7, 2 * 1003, generator=gen) * 6  # F not a multiple of 8: the tail
    gate, up = gate_up[:, :1003].double(), gate_up[:, 1003:].double()
    expected = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(compiled.silu_mul(gate_up, portable=any_cpu).double(), expected, atol=1e-6, rtol=1e-6)


def test_the_gated_mlp_takes_the_compiled_call(compiled, monkeypatch):
    from engine.kernels import activation
    from engine.models import rowwise
    from engine.models.layers import GatedMLP

    mlp = GatedMLP(16, 24)
    x = torch.randn(3, 16)
    calls = []
    kernel = compiled.silu_mul
    monkeypatch.setattr(compiled, "silu_mul", lambda gu: calls.append(gu.shape) or kernel(gu))
    with torch.no_grad():
        fused = mlp(x)
        assert calls == [(3, 48)]
        monkeypatch.setattr(activation, "_blocks", None)
        gate, up = mlp.gate_up_proj(x).split(24, dim=-1)
        torch.testing.assert_close(mlp(x), mlp.down_proj(rowwise.silu(gate) * up), rtol=0, atol=0)
    torch.testing.assert_close(fused, mlp(x).detach(), atol=1e-6, rtol=1e-5)


def _greedy(folder, kv_unified: bool, prompts: list[list[int]], n: int) -> tuple[list[list[int]], list]:
    engine = Engine.from_pretrained(str(folder), n_ctx=512, n_seq_max=4, block_size=8, kv_unified=kv_unified)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seqs = [engine.add_sequence(p, params, seq_id=i) for i, p in enumerate(prompts)]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[seqs.index(ev.seq)].append(ev.logits)
    return [s.output_ids for s in seqs], logits


@pytest.mark.parametrize("layout", ["stream", "unified"])
@pytest.mark.parametrize(
    "arch,overrides",
    [("llama", {}), ("gemma2", {"num_hidden_layers": 4, "sliding_window": 8}), ("gpt_oss", GPT_OSS_TINY)],
    ids=["llama", "gemma2", "gpt_oss"],
)
def test_decode_rows_attend_through_the_kernel_and_sdpa_alike(compiled, tmp_path, monkeypatch, arch, overrides, layout):
    """Both paths equal transformers; the default one calls the kernel once per layer
    per decode step (Gemma 2: soft-capped scores and windowed layers; gpt-oss: sink
    logits, in the store-and-attend call of per-stream caches too)."""
    folder = make_checkpoint(tmp_path / arch, arch, **overrides)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 23)]
    ref_model = load_reference(folder)
    expected = [greedy_reference(ref_model, p, 12) for p in prompts]
    calls = []

    def counting(kernel):
        return lambda *args, **kw: calls.append(args[0].shape[0]) or kernel(*args, **kw)

    monkeypatch.setattr(compiled, "decode_attention", counting(compiled.decode_attention))
    monkeypatch.setattr(compiled, "stream_decode", counting(compiled.stream_decode))  # store + attend, streams
    hooks = (memory.set_decode_kernel, memory.set_store_kernel, memory.set_stream_decode_kernel)
    previous = [hook(None) for hook in hooks]
    try:
        for path in ("kernel", "sdpa"):
            calls.clear()
            if path == "sdpa":
                monkeypatch.setattr("engine.kernels.attention._blocks", None)  # as without the extension
            tokens, logits = _greedy(folder, layout == "unified", prompts, 12)
            n_layers = overrides.get("num_hidden_layers", 2)
            if path == "kernel":
                assert len(calls) >= 11 * n_layers, "decode steps did not take the kernel"
            else:
                assert not calls and kv_view._decode_kernel is None and kv_view._stream_decode_kernel is None
                assert kv_view._store_kernel is None
            for i, (ref_tokens, ref_logits) in enumerate(expected):
                assert tokens[i] == ref_tokens, f"{path}: prompt {i}"
                torch.testing.assert_close(torch.stack(logits[i]), ref_logits.float(), atol=1e-4, rtol=0)
            for hook in hooks:
                hook(None)
    finally:
        for hook, kernel in zip(hooks, previous):
            hook(kernel)


def test_a_long_kernel_call_lets_other_python_threads_run(compiled):
    """The matmul lets go of the GIL, as torch's ops do: the server's event loop runs
    during a decode step's matmuls instead of waiting for the step's next Python line."""
    import sys
    import threading
    import time

    import gguf
    from block_packers import pack

    raw = pack((torch.randn(2048, 4096) * 0.05).numpy(), gguf.GGMLQuantizationType.Q8_0)
    weight = torch.from_numpy(raw).reshape(2048, -1)
    x = torch.randn(40, 4096)
    ticks, started, stop = [0], threading.Event(), threading.Event()

    def count():
        started.set()
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.0002)  # lets go of the GIL: the main thread takes it back at once

    thread = threading.Thread(target=count, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)  # the main thread is never made to let go between two lines: only a call can
    thread.start()
    started.wait(10)
    try:
        during = []
        for _ in range(5):  # each call ~10-50 ms; the counter moves only if the GIL is free meanwhile
            before = ticks[0]
            compiled.block_linear(x, [weight], [int(gguf.GGMLQuantizationType.Q8_0)], 2)
            during.append(ticks[0] - before)
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    assert max(during) > 0, during


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("kernel,bias", [(4, False), (3, True), (2, True)])
def test_the_conv_step_is_the_causal_convolution(compiled, kernel, bias, any_cpu):
    """The short convolution's decode step: the output is the window and the new input
    against the weights, and the window moves on by one, in place."""
    gen = torch.Generator().manual_seed(kernel)
    b, c = 3, 37
    x = torch.randn(b, 2 * c, generator=gen)[:, :c]  # rows strided, as a split projection gives them
    window = torch.randn(b, c, kernel - 1, generator=gen)
    weight, bias_t = torch.randn(c, kernel, generator=gen), torch.randn(c, generator=gen) if bias else None
    full = torch.cat([window, x[:, :, None]], dim=2)  # [B, C, K]
    expected = (full.double() * weight.double()).sum(-1) + (bias_t.double() if bias else 0)
    out = compiled.conv_step(x, window, weight, bias_t, portable=any_cpu)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(window, full[:, :, 1:])


@pytest.mark.parametrize("any_cpu", [False, True], ids=["isa", "portable"])
def test_the_fixed_order_float_product_is_the_matrix_product(compiled, any_cpu):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(40, 3 * 77, generator=gen)[:, :77]  # rows strided; 77 columns: a tail
    w, b = torch.randn(9, 77, generator=gen), torch.randn(9, generator=gen)
    out = compiled.float_linear(x, w, b, portable=any_cpu)
    torch.testing.assert_close(out.double(), x.double() @ w.double().T + b.double(), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[5:6], compiled.float_linear(x[5:6], w, b, portable=any_cpu))


@pytest.mark.parametrize("window", [0, 3])
def test_prompt_attention_with_sinks_through_flash_is_the_explicit_softmax(monkeypatch, window):
    """Prompt rows with sink logits (gpt-oss) take torch's CPU flash kernel, the output
    scaled by sigmoid(lse - sink): the explicit softmax with a sink column, padded rows
    aside; grouped heads, a window and two sequences of different lengths."""
    from memory.attention import explicit_attention as ea

    assert ea._FLASH is not None  # torch 2.13 has it: the fast path is taken
    gen = torch.Generator().manual_seed(window)
    B, H, KVH, Q, L, D = 2, 8, 2, 9, 14, 32
    q, k, v = (
        torch.randn(B, H, Q, D, generator=gen),
        torch.randn(B, KVH, L, D, generator=gen),
        torch.randn(B, KVH, L, D, generator=gen),
    )
    sinks = torch.randn(H, generator=gen) * 2
    q_pos = torch.stack([torch.arange(5, 5 + Q), torch.arange(2, 2 + Q)])  # [B, Q]
    kv_pos = torch.arange(L).expand(B, L)
    seen = kv_pos[:, None, :] <= q_pos[:, :, None]  # [B, Q, L]
    if window:
        seen &= kv_pos[:, None, :] > q_pos[:, :, None] - window
    mask = torch.zeros(B, 1, Q, L).masked_fill(~seen[:, None], float("-inf"))
    calls = []
    flash = ea._FLASH
    monkeypatch.setattr(ea, "_FLASH", lambda *a, **kw: calls.append(1) or flash(*a, **kw))
    fast = ea.explicit_attention(q, k, v, mask, D**-0.5, None, sinks)
    assert calls
    monkeypatch.setattr(ea, "_FLASH", None)
    slow = ea.explicit_attention(q, k, v, mask, D**-0.5, None, sinks)
    torch.testing.assert_close(fast, slow, atol=2e-6, rtol=1e-5)
    plain = ea.explicit_attention(q, k, v, mask, D**-0.5, None, None)
    assert (fast - plain).abs().max() > 1e-2  # the sinks take weight


@pytest.mark.parametrize("vocab", [1, 7, 8, 29, 1000])
def test_the_greedy_pass_is_torchs_clamp_and_argmax_in_one_call(compiled, monkeypatch, vocab):
    """Sampling's pass before the greedy pick in one call: NaN to -bound, clamped to
    +-bound in place, the first of equal maxima (ties, +-0, infinities, NaN rows, the
    tail past whole vectors): what torch's three ops give; ``sample`` takes it."""
    from engine.kernels import pick
    from engine.sampling import sampler

    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=gen)
    x[1, -1] = float("inf")
    x[2] = float("nan")
    x[3] = 0.0
    x[3, vocab // 2 :] = -0.0
    x[4, vocab // 3] = x[4, -1] = x[4].max() + 1  # a tie: the first wins
    x[5, 0] = float("-inf")
    x[5, -1] = float("nan")
    bound = sampler._FINITE
    expected = x.clone().nan_to_num_(nan=-bound).clamp_(-bound, bound)
    got = x.clone()
    tokens = pick.finite_argmax(got, bound)
    assert tokens.tolist() == expected.argmax(-1).tolist()
    assert torch.equal(got, expected)
    calls, original = [], compiled.finite_argmax
    monkeypatch.setattr(compiled, "finite_argmax", lambda *a: calls.append(1) or original(*a))
    rows = [sampler.SampleRow(SamplingParams(temperature=0.0), 0, [], []) for _ in range(6)]
    assert sampler.sample(x.clone(), rows).tokens == tokens.tolist() and calls
