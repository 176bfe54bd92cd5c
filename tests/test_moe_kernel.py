"""The compiled mixture-of-experts calls (engine/kernels/moe_kernel.py, csrc/moe_op.inc):
the router's top-k and softmax as torch computes them, and the routed experts as the
eager path computes them on the same packed weights (gated silu experts whose gate and
up are parts of different types, K-quant downs; gpt-oss's clamped experts in MXFP4 with
biases), each token's bits the same alone as in a batch."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from block_packers import pack
from torch import nn
from unavailable import unavailable

from engine.kernels import blocks, moe_kernel
from engine.kernels.blocks import BlockLinear, BlockWeight
from engine.models.gpt_oss import ClampedExpert
from engine.models.layers import GatedMLP
from engine.models.moe import run_experts

T = gguf.GGMLQuantizationType
HIDDEN, FFN, EXPERTS, TOP_K = 256, 256, 6, 3
pytestmark = pytest.mark.usefixtures("kernel_threads")


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if blocks.compiled_isa() is None:
        unavailable("the compiled kernels are not built (pip install -e . with a C++ compiler)", "SLOTSERVE_SKIP_EXT")


def _packed(rng: np.random.Generator, parts: list[tuple[int, T]], cols: int, bias: bool) -> BlockLinear:
    lin = BlockLinear(cols, [rows for rows, _ in parts], bias=bias)
    for i, (rows, qtype) in enumerate(parts):
        w = (rng.standard_normal((rows, cols)) * 0.08).astype(np.float32)
        lin.set_part(i, BlockWeight.from_bytes(qtype, torch.from_numpy(pack(w, qtype)), rows, cols))
    assert lin.pack() > 0
    if bias:
        lin.bias.copy_(torch.from_numpy(rng.standard_normal(lin.out_features).astype(np.float32) * 0.1))
    return lin


def silu_experts(seed: int = 0) -> nn.ModuleList:
    """Gate Q4_K and up Q8_0 side by side, down Q6_K."""
    rng = np.random.default_rng(seed)
    experts = nn.ModuleList(GatedMLP(HIDDEN, FFN) for _ in range(EXPERTS))
    for m in experts:
        m.gate_up_proj = _packed(rng, [(FFN, T.Q4_K), (FFN, T.Q8_0)], HIDDEN, bias=False)
        m.down_proj = _packed(rng, [(HIDDEN, T.Q6_K)], FFN, bias=False)
    return experts


def clamped_experts(seed: int = 1) -> nn.ModuleList:
    """gpt-oss's: MXFP4 with biases, a limit the values reach."""
    rng = np.random.default_rng(seed)
    experts = nn.ModuleList(ClampedExpert(HIDDEN, FFN, alpha=1.702, limit=0.4) for _ in range(EXPERTS))
    for m in experts:
        m.gate_up_proj = _packed(rng, [(2 * FFN, T.MXFP4)], HIDDEN, bias=True)
        m.down_proj = _packed(rng, [(HIDDEN, T.MXFP4)], FFN, bias=True)
    return experts


def _routing(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, HIDDEN, generator=g)  # [T, hidden]
    idx = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(n)])  # [T, k]
    weights = torch.softmax(torch.randn(n, TOP_K, generator=g), dim=-1)  # [T, k]
    return x, weights, idx


@pytest.mark.parametrize("make", [silu_experts, clamped_experts], ids=["silu", "clamped"])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_the_fused_experts_are_the_eager_ones_and_a_tokens_bits_do_not_depend_on_the_batch(monkeypatch, make, n):
    experts = make()
    x, weights, idx = _routing(n, seed=n)
    with torch.inference_mode():
        fused = moe_kernel.experts(x, experts, weights, idx)
        assert fused is not None  # the compiled call took these experts
        monkeypatch.setattr(moe_kernel, "enabled", False)
        eager = run_experts(x, experts, weights, idx)
        monkeypatch.setattr(moe_kernel, "enabled", True)
        alone = torch.cat(
            [moe_kernel.experts(x[i : i + 1], experts, weights[i : i + 1], idx[i : i + 1]) for i in range(n)]
        )
    # the same packed weights and int8 activations; the clamped activation is computed
    # as silu(alpha g) (u + 1) / alpha, whose last bits may move a rounded activation
    tol = 1e-6 if make is silu_experts else 2e-3
    assert torch.allclose(fused, eager, rtol=0, atol=tol * eager.abs().max().item())
    assert torch.equal(fused, alone)
    assert not torch.allclose(fused, moe_kernel.experts(x, experts, weights.flip(-1), idx))  # the weights count


def test_the_clamp_takes_effect():
    """The same weights under a looser limit answer otherwise: the limit is applied."""
    experts = clamped_experts()
    x, weights, idx = _routing(5, seed=3)
    with torch.inference_mode():
        tight = moe_kernel.experts(x, experts, weights, idx)
        for m in experts:
            m.fused_act = (1, 1.702, 50.0)
        experts._fused = None
        loose = moe_kernel.experts(x, experts, weights, idx)
    assert not torch.allclose(tight, loose, atol=1e-3)


def test_experts_it_cannot_take_go_the_eager_way():
    experts = silu_experts()
    x, weights, idx = _routing(3, seed=0)
    assert moe_kernel.experts(x.double(), experts, weights, idx) is None  # not float32
    plain = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, HIDDEN)) for _ in range(EXPERTS))  # no fused_act
    assert moe_kernel.experts(x, plain, weights, idx) is None
    float_experts = nn.ModuleList(GatedMLP(HIDDEN, FFN) for _ in range(EXPERTS))  # not in blocks
    assert moe_kernel.experts(x, float_experts, weights, idx) is None


@pytest.mark.parametrize("mode", sorted(moe_kernel.ROUTER_MODES))
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_router_picks_and_weighs_as_torch(mode, bias):
    g = torch.Generator().manual_seed(7)
    router = nn.Linear(HIDDEN, 16, bias=bias)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, HIDDEN, generator=g) * 0.1)
        router.weight[5] = router.weight[2]  # a tie in every row: the lower id first
        if bias:
            router.bias[5] = router.bias[2]
    x = torch.randn(9, HIDDEN, generator=g)
    with torch.inference_mode():
        weights, idx = moe_kernel.route(x, router, 4, mode)
        logits = blocks._blocks.float_linear(x, router.weight, router.bias)  # [T, E] the fixed-order products
        assert torch.allclose(logits, router(x), atol=1e-5)
    assert torch.equal(logits[:, 5], logits[:, 2])
    if mode == "topk_softmax":
        top, expect_idx = logits.topk(4, dim=-1)
        expect = torch.softmax(top, dim=-1)
    else:
        expect, expect_idx = torch.softmax(logits, dim=-1).topk(4, dim=-1)
        if mode.endswith("_norm"):
            expect = expect / expect.sum(-1, keepdim=True)

    def dense(i: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # [T, E], 0 where not chosen
        return torch.zeros(len(x), 16).scatter(1, i, w)

    picked = logits.gather(1, idx)  # largest first
    assert (picked[:, :-1] >= picked[:, 1:]).all()
    assert not ((idx == 5).any(-1) & ~(idx == 2).any(-1)).any()  # 5 never without 2
    assert (idx == 2).any(-1).sum() >= 3  # the tie is met
    rows = (torch.sort(idx, -1).values == torch.sort(expect_idx, -1).values).all(-1)
    assert torch.equal(~rows, (expect_idx == 5).any(-1) & ~(expect_idx == 2).any(-1))  # torch's tie may go to 5
    assert torch.allclose(dense(idx, weights)[rows], dense(expect_idx, expect)[rows], atol=1e-6)
