"""The static decode step (engine/core/static_decode.py) on the CPU: the code CUDA graphs
capture, run eagerly. Its tokens are the general path's, in every schedule; its
attention through block tables is plain attention; a failed step leaves memory as it
was; models it cannot serve keep the general path. (On CUDA: tests/test_cuda.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from checkpoints import make_checkpoint

from engine import Engine, SamplingParams
from engine.core.static_decode import ladder
from engine.errors import StepFailed
from engine.kernels.table_attention import TableLayout, reference_table_attention


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    return {
        "llama": make_checkpoint(root / "llama", "llama"),
        "qwen3": make_checkpoint(root / "qwen3", "qwen3"),  # q/k norms
        "gemma2": make_checkpoint(root / "gemma2", "gemma2", sliding_window=8),
    }


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7, max_tokens=11, ignore_eos=True),
    SamplingParams(temperature=0.8, min_p=0.05, repetition_penalty=1.3, seed=3, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3, max_tokens=9, ignore_eos=True),
]
PROMPTS = [[5, 6, 7], list(range(40, 75)), [9] * 12, [100, 3]]


def staggered(engine: Engine) -> tuple[list[list[int]], int]:
    """Sequences join while others decode (prompts in chunks of 8 tokens): decode-only
    steps and mixed ones alternate. -> (each sequence's tokens, static steps run)."""
    seqs, t = [], 0
    while t < 3 or engine.has_work:
        if t < len(PROMPTS) * 3 and t % 3 == 0:
            i = t // 3
            engine.memory.seq_rm(i)
            seqs.append(engine.add_sequence(PROMPTS[i], PARAMS[i], i))
        faults = [e.error for e in engine.step() if e.error is not None]
        assert not faults, faults  # every sequence runs to its max_tokens
        t += 1
    static = engine.static.n_steps if engine.static is not None else 0
    return [s.output_ids for s in seqs], static


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "stream"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_steps_give_the_general_paths_tokens(folders, arch, unified):
    runs = {}
    for static in (False, True):
        engine = Engine.from_pretrained(
            str(folders[arch]), n_ctx=512, n_seq_max=5, kv_unified=unified, block_size=4, max_batch_tokens=8,
            static_decode=static, device="cpu",
        )  # fmt: skip
        assert (engine.static is not None) == static
        runs[static] = staggered(engine)
        engine.memory.integrity_check()
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > 10 and runs[False][1] == 0  # decode-only steps went the static way


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "stream"])
def test_a_padded_batch_writes_nothing_of_its_own(folders, unified):
    """Three sequences run as a batch of four (the ladder has no 3): the padding row
    repeats the first row, so no other cell changes and the tokens are the same."""
    outs = []
    for static in (False, True):
        engine = Engine.from_pretrained(
            str(folders["llama"]),
            n_ctx=512,
            n_seq_max=5,
            kv_unified=unified,
            block_size=4,
            static_decode=static,
            device="cpu",
        )
        outs.append([g.token_ids for g in engine.generate(PROMPTS[1:4], PARAMS[1:4])])
    assert engine.static.size_for(3) == 4 and engine.static.n_steps >= 8
    assert outs[0] == outs[1]


def test_a_shifted_context_reads_its_cells_not_its_positions(folders):
    """After a context shift a stream's cells hold positions other than their index:
    the static step counts cells, as the general path does."""
    outs = []
    for static in (False, True):
        engine = Engine.from_pretrained(
            str(folders["llama"]),
            n_ctx=64,
            n_seq_max=2,
            kv_unified=False,
            context_shift=True,
            static_decode=static,
            device="cpu",
        )
        params = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
        outs.append(engine.generate([[1, 2, 3, 4], [8, 9]], params))
    assert [g.token_ids for g in outs[0]] == [g.token_ids for g in outs[1]]
    assert all(len(g.token_ids) == 80 for g in outs[1])  # each shifted at least once (32 cells a stream)


def test_a_failed_static_step_leaves_memory_as_it_was(folders, monkeypatch):
    engine = Engine.from_pretrained(str(folders["llama"]), n_ctx=256, n_seq_max=3, static_decode=True, device="cpu")
    for i in range(2):
        engine.add_sequence([3, 4, 5 + i], SamplingParams(temperature=0.0, max_tokens=8), i)
    engine.step()  # the prompts: the general path
    before = [engine.memory.seq_pos_max(i) for i in range(2)]

    def broken(size):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.static, "forward", broken)
    with pytest.raises(StepFailed):
        engine.step()
    assert [engine.memory.seq_pos_max(i) for i in range(2)] == before
    engine.memory.integrity_check()


def test_models_the_static_step_cannot_serve_keep_the_general_path(folders):
    gemma = Engine.from_pretrained(str(folders["gemma2"]), n_ctx=256, n_seq_max=2, static_decode=True, device="cpu")
    assert gemma.static is None  # soft-capped scores and sliding windows
    quantized = Engine.from_pretrained(
        str(folders["llama"]), n_ctx=256, quantization="q8_0", static_decode=True, device="cpu"
    )
    assert quantized.static is None
    f16_keys = Engine.from_pretrained(
        str(folders["llama"]), n_ctx=256, cache_type_k="f16", static_decode=True, device="cpu"
    )
    assert f16_keys.static is None  # keys stored in another type than the model computes in
    out = gemma.generate([[4, 5, 6]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_the_ladder_pads_every_batch_size_to_a_captured_one():
    assert ladder(1) == [1]
    assert ladder(5) == [1, 2, 4, 5]
    assert ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert ladder(20) == [1, 2, 4, 8, 16, 20]
    for n_max in (1, 3, 9, 64, 70):
        sizes = ladder(n_max)
        assert sizes == sorted(set(sizes)) and sizes[-1] == n_max
        assert all(next(s for s in sizes if s >= n) - n < 8 for n in range(1, n_max + 1))


def _attention_by_rows(q, k_rows, v_rows, table, lens, n_kv_heads, lay, scale):
    """One row, one head at a time, in float64: the definition."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // n_kv_heads
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            rows = [
                int(table[b, j // lay.block]) * lay.stride_block + (h // group) * lay.stride_head
                + (j % lay.block) * lay.stride_cell
                for j in range(int(lens[b]))
            ]  # fmt: skip
            keys, values = k_rows[rows].double(), v_rows[rows].double()
            weights = torch.softmax(keys @ q[b, h].double() * scale, 0)
            out[b, h] = weights @ values
    return out


def _table_case(layout: str, dtype: torch.dtype, seed: int, n_rows: int = 3):
    """A batch as the static step hands it over: lens and table are columns of one int64
    buffer (strided); lengths from 1 to the table's whole width."""
    gen = torch.Generator().manual_seed(seed)
    n_heads, n_kv_heads, head_dim = 8, 2, 32
    if layout == "paged":
        bs, width = 16, 7
        n_blocks = n_rows * width + 3
        k = torch.randn(n_blocks * bs, n_kv_heads, head_dim, generator=gen)
        lay = TableLayout(bs, bs * n_kv_heads, 1, n_kv_heads)
        table = torch.randperm(n_blocks, generator=gen)[: n_rows * width].view(n_rows, width)
    else:
        bs, width = 128, 1
        k = torch.randn(n_rows + 1, n_kv_heads, bs, head_dim, generator=gen)
        lay = TableLayout(bs, n_kv_heads * bs, bs, 1)
        table = torch.randperm(n_rows + 1, generator=gen)[:n_rows, None]
    buf = torch.zeros(n_rows, 4 + width, dtype=torch.long)  # as static_decode.py's step buffer
    buf[:, 2] = torch.randint(1, width * bs + 1, (n_rows,), generator=gen)
    buf[0, 2], buf[-1, 2] = 1, width * bs
    buf[:, 4:] = table
    lens, table = buf[:, 2], buf[:, 4:]
    v = torch.randn(k.shape, generator=gen)
    q = torch.randn(n_rows, n_heads, head_dim, generator=gen)
    k_rows, v_rows = k.view(-1, head_dim).to(dtype), v.view(-1, head_dim).to(dtype)
    return q.to(dtype), k_rows, v_rows, table, lens, n_kv_heads, lay, head_dim**-0.5


@pytest.mark.parametrize("n_rows", [3, 8])
@pytest.mark.parametrize("layout", ["paged", "stream"])
def test_table_attention_is_attention_over_each_rows_cells(layout, n_rows):
    case = _table_case(layout, torch.float32, seed=n_rows, n_rows=n_rows)
    out = reference_table_attention(*case)
    expect = _attention_by_rows(*case)
    assert (out.double() - expect).abs().max() < 1e-5


TRITON_CHECK = """
import torch, sys
sys.path.insert(0, "tests")
from test_static_decode import _table_case, _attention_by_rows
from engine.kernels.triton_decode import triton_decode_attention
for layout, n_rows in (("paged", 3), ("stream", 3), ("paged", 8), ("stream", 8)):  # 32 splits; 17 (not a power of 2)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        case = _table_case(layout, dtype, seed=2, n_rows=n_rows)
        out = triton_decode_attention(*case)
        err = (out.double() - _attention_by_rows(*case)).abs().max().item()
        assert out.dtype == dtype and err < tol, (layout, dtype, err)
from engine.kernels import triton_ops
x, w = torch.randn(5, 96), torch.randn(96)
assert torch.allclose(triton_ops.rms_norm(x, w, 1e-6), w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
qkv, cos, sin = torch.randn(3, 12 * 16), torch.randn(3, 1, 16), torch.randn(3, 1, 16)
qk = qkv[:, : 10 * 16].view(3, 10, 16)  # strided rows, as the fused projection's slice
assert torch.allclose(triton_ops.rotate(qk, cos, sin), torch.addcmul(qk * cos, qk.roll(8, -1), sin), atol=1e-6)
gate_up = torch.randn(4, 3000)
expect = torch.nn.functional.silu(gate_up[:, :1500]) * gate_up[:, 1500:]
assert torch.allclose(triton_ops.silu_mul(gate_up), expect, atol=1e-6)
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton (the CUDA build has it)")
def test_the_triton_kernel_computes_the_same_in_its_interpreter():
    """The CUDA kernels' logic (decode attention; RMSNorm, rotary, silu * up), run by
    Triton's interpreter on the CPU (its bfloat16 dot is not emulated: float32 and
    float16 here; bfloat16 on the GPU, tests/test_cuda.py)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
