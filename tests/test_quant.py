"""Q8_0 weights kept quantized (engine/kernels/quant.py): the block format as GGUF writes
it, both matmul paths (the compiled kernel and the torch-only one) against float64 on
the dequantized weight within a bound derived from the activations' rounding, and a
model quantized at load (``--quantization q8_0``) against the float32 model on the same
dequantized weights, teacher-forced over 512 positions.

Bound: the compiled kernel rounds each 32-value block of an activation row to int8 with
step dx = max|x_block| / 127, so each value moves by at most dx / 2, and an output moves
by at most sum over blocks of dx / 2 * sum |w| of that block (w the dequantized weight),
plus float32 accumulation (1e-5 relative). The torch-only path does not round the
activations: float32 accumulation only.
"""

from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest
import torch
from unavailable import unavailable

from engine import DEMO_MODEL, Engine, SamplingParams
from engine.kernels import quant

Q8_0 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture(scope="module")
def compiled():
    if quant.compiled_isa() is None:
        unavailable("the compiled kernels are not built (pip install -e . with a C++ compiler)", "SLOTSERVE_SKIP_EXT")
    return quant.compiled_isa()


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0  # an all-zero block (scale 0)
    w[-1, -32:] *= 40  # a block with outliers
    return w


@pytest.mark.parametrize(("n", "k"), [(37, 32), (64, 96), (300, 4096)])
def test_blocks_are_the_bytes_gguf_writes_and_reads(n, k):
    w = _weight(n, k, seed=n)
    raw = gguf.quants.quantize(w.numpy(), Q8_0)  # [n, k / 32 * 34] uint8
    qs, d = quant.q8_0_from_blocks(raw.tobytes(), n, k)
    assert torch.equal(quant.q8_0_dequantize(qs, d), torch.from_numpy(gguf.quants.dequantize(raw, Q8_0)))
    ours = quant.q8_0_quantize(w)
    assert torch.equal(ours[0], qs) and torch.equal(ours[1], d)
    with pytest.raises(ValueError, match="bytes"):
        quant.q8_0_from_blocks(raw.tobytes()[:-1], n, k)


def _bound(x: torch.Tensor, w: torch.Tensor, rounded: bool) -> torch.Tensor:
    """[M, N] float64: how far each output may be from x @ w.T in float64."""
    x64, w64 = x.double(), w.double()
    slack = 1e-5 * (x64.abs() @ w64.abs().T) + 1e-6
    if not rounded:
        return slack
    m, k = x.shape
    dx = x64.reshape(m, k // 32, 32).abs().amax(-1) / 127  # [M, K/32]
    wsum = w64.abs().reshape(w.shape[0], k // 32, 32).sum(-1)  # [N, K/32]
    return dx / 2 @ wsum.T + slack


@pytest.mark.parametrize("path", ["compiled", "torch"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 32), (3, 64, 96), (32, 300, 4096), (5, 1030, 256)])
def test_matmul_is_within_the_derived_bound(request, path, m, n, k):
    if path == "compiled":
        request.getfixturevalue("compiled")
    w = _weight(n, k, seed=k)
    qs, d = quant.q8_0_quantize(w)
    deq = quant.q8_0_dequantize(qs, d)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
    y = quant.q8_0_linear(x, qs, d, compiled=path == "compiled")  # [m, n]
    assert y.shape == (m, n) and y.dtype == torch.float32
    err = (y.double() - x.double() @ deq.double().T).abs()
    bound = _bound(x, deq, rounded=path == "compiled")
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3g}"
    if path == "compiled":  # the bound is not vacuous: the rounding shows, within it
        assert err.max() > 0
    y3 = quant.q8_0_linear(x.reshape(m, 1, k), qs, d, compiled=path == "compiled")  # leading dims kept
    assert torch.equal(y3.reshape(m, n), y)


def test_without_the_extension_the_torch_path_runs_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(quant, "_quant", None)
    assert quant.compiled_isa() is None
    with caplog.at_level(logging.INFO, logger="slotserve.kernels"):
        quant.log_kernel_choice()
    assert [r.message for r in caplog.records if "torch-only" in r.message]
    w = _weight(64, 64, seed=3)
    layer = quant.Q8Linear(*quant.q8_0_quantize(w), bias=torch.ones(64))
    x = torch.randn(2, 64)
    expected = torch.nn.functional.linear(x, quant.q8_0_dequantize(layer.qs, layer.d), torch.ones(64))
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def _teacher_forced_top1(engine: Engine, ids: list[int]) -> list[int]:
    """The engine's top token after each prefix of ``ids`` (one forward per position:
    the prefix before is reused from the slot's cache)."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    out = []
    for i in range(1, len(ids)):
        seq = engine.add_sequence(ids[:i], params, seq_id=0, n_cached=i - 1)
        while engine.has_work:
            engine.step()
        out.append(seq.output_ids[0])
    return out


def _dequantized_float_engine() -> Engine:
    """The float32 model whose quantized layers hold exactly the Q8_0 values."""
    engine = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, linear="torch")
    for name, module in engine.model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.in_features % 32 == 0 and not name.endswith("lm_head"):
            module.weight.copy_(quant.q8_0_dequantize(*quant.q8_0_quantize(module.weight)))
    return engine


@pytest.mark.parametrize("path", ["compiled", "torch"])
def test_a_model_quantized_at_load_agrees_with_its_dequantized_float_model(request, monkeypatch, path):
    if path == "compiled":
        request.getfixturevalue("compiled")
    else:
        monkeypatch.setattr(quant, "_quant", None)
    text = (DEMO_MODEL.parent / "core" / "engine.py").read_text()  # Python source: the demo model's kind of text
    q8 = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, quantization="q8_0")
    layers = [m for m in q8.model.modules() if isinstance(m, quant.Q8Linear)]
    assert layers and not any(isinstance(m, torch.nn.Linear) for m in q8.model.model.layers.modules())
    assert q8.fingerprint["quantization"] == "q8_0"
    n = 513 if path == "compiled" else 129  # the torch path must agree everywhere: fewer positions show it
    ids = q8.tokenizer.encode(text)[:n]
    assert len(ids) == n
    ours = _teacher_forced_top1(q8, ids)
    reference = _teacher_forced_top1(_dequantized_float_engine(), ids)
    agree = np.mean([a == b for a, b in zip(ours, reference)])
    assert agree >= 0.99, f"top-1 agrees at {agree:.1%} of {n - 1} positions"
    if path == "torch":  # no activation rounding: the same float arithmetic up to order
        assert agree == 1.0


def test_quantization_needs_float32():
    with pytest.raises(ValueError, match="float32"):
        Engine.from_pretrained(str(DEMO_MODEL), quantization="q8_0", dtype="bfloat16")
    with pytest.raises(ValueError, match="q8_0"):
        Engine.from_pretrained(str(DEMO_MODEL), quantization="q4_x")


def test_a_server_started_with_quantization_serves(caplog):
    import httpx
    from server_proc import InProcessServer

    with caplog.at_level(logging.INFO, logger="slotserve.kernels"), InProcessServer(quantization="q8_0") as srv:
        r = httpx.post(srv.url + "/completion", json={"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
    assert [r.message for r in caplog.records if r.message.startswith("quantized matmuls:")]


def test_the_quantization_flag_is_checked():
    from pydantic import ValidationError

    from server.settings import ServerSettings

    with pytest.raises(ValidationError, match="quantization"):
        ServerSettings(quantization="q4_x")
    assert ServerSettings(quantization="q8_0").quantization == "q8_0"
