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


def test_a_short_batchs_float_projection_is_its_rows_one_at_a_time():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(128, 512, generator=gen), torch.randn(128, generator=gen)
    x = torch.randn(rowwise.SHORT_BATCH, 512, generator=gen)
    for n in (2, 9, rowwise.SHORT_BATCH):
        y = rowwise.linear(x[:n], w, b)
        assert all(torch.equal(y[i : i + 1], F.linear(x[i : i + 1], w, b)) for i in range(n))
    layer = torch.nn.Linear(512, 128)
    assert torch.equal(rowwise.project(layer, x[:5])[3], rowwise.project(layer, x[3:4])[0])
    long = torch.randn(rowwise.SHORT_BATCH + 1, 512, generator=gen)  # one matrix product
    torch.testing.assert_close(rowwise.linear(long, w, b), F.linear(long, w, b), rtol=0, atol=0)
