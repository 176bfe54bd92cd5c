"""engine/models/rowwise.py: activations and small float projections computed alike
for a row alone and for the same row in a longer batch (a speculation's verify step
against the decode steps it stands for), and within float rounding of torch's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models import rowwise

ACTIVATIONS = {
    "sigmoid": (rowwise.sigmoid, torch.sigmoid),
    "silu": (rowwise.silu, F.silu),
    "softplus": (rowwise.softplus, F.softplus),
    "gelu_tanh": (rowwise.gelu_tanh, lambda x: F.gelu(x, approximate="tanh")),
}


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("width", [4, 24, 100])  # narrower than a vector, a vector and a tail, several
def test_an_activation_gives_a_row_the_same_bits_in_any_batch(name, width):
    ours, theirs = ACTIVATIONS[name]
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(width)) * 8
    x[0, 0], x[1, 0] = 30.0, -30.0  # softplus's threshold, exp's far ends
    whole = ours(x)
    assert all(torch.equal(whole[i : i + 1], ours(x[i : i + 1])) for i in range(len(x)))
    torch.testing.assert_close(whole, theirs(x), atol=1e-6, rtol=1e-6)


def test_off_float32_cpu_the_activations_are_torchs():
    x = torch.randn(5, 7).bfloat16()
    assert torch.equal(rowwise.silu(x), F.silu(x))
    assert torch.equal(rowwise.sigmoid(x), torch.sigmoid(x))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_a_short_batchs_float_projection_gives_a_row_the_same_bits_alone(compiled, monkeypatch):
    """The compiled fixed-order product, or (no compiler) BLAS row by row."""
    if not compiled:
        monkeypatch.setattr(rowwise, "_blocks", None)
    elif rowwise._blocks is None:
        pytest.skip("the compiled kernels are not built")
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(128, 500, generator=gen), torch.randn(128, generator=gen)  # 500: the columns' tail
    x = torch.randn(rowwise.SHORT_BATCH, 500, generator=gen)
    for n in (2, 9, rowwise.SHORT_BATCH):
        y = rowwise.linear(x[:n], w, b)
        assert all(torch.equal(y[i : i + 1], rowwise.linear(x[i : i + 1], w, b)) for i in range(n))
        torch.testing.assert_close(y, F.linear(x[:n], w, b), atol=1e-4, rtol=1e-5)
    layer = rowwise.Linear(500, 128)
    assert torch.equal(layer(x[:5])[3], layer(x[3:4])[0])
    long = torch.randn(rowwise.SHORT_BATCH + 1, 500, generator=gen)  # one matrix product
    torch.testing.assert_close(rowwise.linear(long, w, b), F.linear(long, w, b), rtol=0, atol=0)


def test_routers_are_not_handed_to_onednn():
    """``pack_linears`` (oneDNN's prepacked kernels, chosen per row count) leaves a
    ``rowwise.Linear`` as it is and packs the other linear layers."""
    from engine.kernels.packed_linear import PackedLinear, onednn_available, pack_linears

    if not onednn_available():
        pytest.skip("no oneDNN in this torch")
    model = torch.nn.Sequential(rowwise.Linear(32, 4), torch.nn.Linear(4, 8))
    assert pack_linears(model) == 1
    assert type(model[0]) is rowwise.Linear and isinstance(model[1], PackedLinear)
