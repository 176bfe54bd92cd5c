"""The gated delta rule's chunked prefill and batched decode step (engine/models/delta_rule.py)
against the token-by-token recurrence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.delta_rule import delta_chunked, delta_rule, delta_step


def inputs(n: int, h: int = 3, dk: int = 16, dv: int = 8, decay: float = 0.5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1) / dk**0.5
    k = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1)
    v = torch.randn(n, h, dv, generator=gen)
    g = -torch.rand(n, h, generator=gen) * decay
    beta = torch.rand(n, h, generator=gen)
    return q, k, v, g, beta, torch.randn(h, dk, dv, generator=gen) * 0.1


@pytest.mark.parametrize("n", [1, 8, 9, 63, 64, 65, 200])
@pytest.mark.parametrize("decay", [0.5, 30.0])  # 30: the decay through a chunk underflows float32
def test_the_chunked_rule_is_the_recurrence(n, decay):
    args = inputs(n, decay=decay)
    y, state = delta_rule(*args)
    y_c, state_c = delta_chunked(*args, chunk=16)
    torch.testing.assert_close(y_c, y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state_c, state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["compiled", "portable", "torch"])
@pytest.mark.parametrize("dv", [8, 13, 128])  # 13: the columns' tail
def test_the_decode_step_is_the_recurrence_for_each_sequence(path, dv, monkeypatch):
    """The batched step, compiled (engine/kernels/csrc/delta_impl.inc: its best unit and
    the portable one) and in torch: the state updated in place."""
    from engine.models import delta_rule as rule

    if path == "torch":
        monkeypatch.setattr(rule, "_blocks", None)
    elif rule._blocks is None:
        pytest.skip("the compiled kernels are not built")
    elif path == "portable":
        kernel = rule._blocks

        class Portable:
            @staticmethod
            def delta_step(*args):
                return kernel.delta_step(*args, portable=True)

        monkeypatch.setattr(rule, "_blocks", Portable)
    seqs = [inputs(1, dv=dv, seed=s) for s in range(4)]
    stacked = [torch.stack([a[i][0] if i < 5 else a[i] for a in seqs]) for i in range(6)]  # [B, ...]
    state = stacked[5]
    y, out = delta_step(*stacked)
    assert out is state  # in place
    for b, args in enumerate(seqs):
        y_ref, s_ref = delta_rule(*args)
        torch.testing.assert_close(y[b], y_ref[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(state[b], s_ref, atol=1e-6, rtol=1e-6)
