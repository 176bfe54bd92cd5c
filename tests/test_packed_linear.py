"""The oneDNN-prepacked linear: same numbers as F.linear, and a bounded set of shapes
(oneDNN keeps an output-sized buffer per shape it has seen, for the process's life)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import packed_linear
from engine.kernels.packed_linear import CHUNK_ROWS, EXACT_ROWS, PackedLinear, onednn_available

pytestmark = pytest.mark.skipif(not onednn_available(), reason="oneDNN linear not in this torch build")


@pytest.mark.parametrize("bias", [False, True])
def test_equal_to_f_linear_for_every_kind_of_row_count(bias):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    for m in (1, 7, EXACT_ROWS, EXACT_ROWS + 1, CHUNK_ROWS - 1, CHUNK_ROWS, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 5):
        x = torch.randn(m, 48)
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    x = torch.randn(3, 100, 48)  # leading dimensions are kept
    torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_row_counts_reaching_onednn_are_bounded(monkeypatch):
    seen: set[int] = set()
    real = packed_linear.onednn_linear

    def recording(rows, packed, bias):
        seen.add(rows.shape[0])
        return real(rows, packed, bias)

    monkeypatch.setattr(packed_linear, "onednn_linear", recording)
    packed = PackedLinear(nn.Linear(16, 16))
    for m in range(1, 1100):
        packed(torch.randn(m, 16))
    assert seen == set(range(1, EXACT_ROWS + 1)) | set(range(2 * EXACT_ROWS, CHUNK_ROWS + 1, EXACT_ROWS))
