"""A mixture-of-experts layer's router and routed experts as two compiled calls
(engine/kernels/csrc/moe_op.inc) instead of ~10 eager ops and two matmul calls per
chosen expert: ``route`` (the router's logits, top-k and softmax) and ``experts`` (the
activations rounded once, every chosen expert's gate/up groups in one parallel loop, the
activation, every down in another, each token's outputs summed in ascending expert
order). Either answers None where it cannot take the layer (no extension, weights not
packed, a type other than float32, an expert without a ``fused_act``): the caller runs
the eager path, which gives the same tokens (tests compare the two).

An expert takes the fused path when it has packed ``gate_up_proj`` (gate rows, then up
rows) and ``down_proj`` BlockLinears and says its activation as ``fused_act``:
(0, _, _) silu(gate) * up; (1, alpha, limit) gpt-oss's clamped SwiGLU."""

from __future__ import annotations

import torch
from torch import nn

from engine.kernels.blocks import BlockLinear

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None

enabled = True  # False: the eager path (tests compare the two)
ROUTE_MAX_ROWS = 64  # longer batches: the eager router (BLAS), as rowwise.linear does
ROUTER_MODES = {"topk_softmax": 0, "softmax_topk": 1, "softmax_topk_norm": 2}


def _usable(x: torch.Tensor) -> bool:
    return _blocks is not None and enabled and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2


def route(x: torch.Tensor, router: nn.Module, k: int, mode: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [T, hidden], a float32 linear router [E, hidden] -> (weights [T, k] float32,
    expert ids [T, k] int64), the k largest logits first; ``mode`` a key of
    ``ROUTER_MODES``: the softmax of the k logits, or their probabilities among all E
    (renormalized to sum 1 with ``_norm``). None: take the eager path."""
    w = getattr(router, "weight", None)
    if not _usable(x) or x.shape[0] > ROUTE_MAX_ROWS or not isinstance(w, torch.Tensor) or w.dtype != torch.float32:
        return None
    return _blocks.moe_route(x, w, router.bias, k, ROUTER_MODES[mode])


def experts(x: torch.Tensor, modules: nn.ModuleList, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor | None:
    """x [T, hidden]; weights, idx [T, k] -> [T, hidden], the weighted sum of each token's
    experts; None: take the eager path."""
    if not _usable(x):
        return None
    args = _args(modules)
    if args is None or idx.numel() >= args[1]:
        return None
    return _blocks.moe_experts(x, idx, weights, args[0])


def _args(modules: nn.ModuleList) -> tuple | None:
    """What the compiled call takes for these experts, built and checked once: (the
    extension's ExpertSet, the most pairs a call takes); None: not fusable."""
    key = id(modules[0].gate_up_proj) if hasattr(modules[0], "gate_up_proj") else None
    cached = getattr(modules, "_fused", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    args = _build(modules) if key is not None else None
    modules._fused = (key, args)
    return args


def _build(modules: nn.ModuleList) -> tuple | None:
    acts = {getattr(m, "fused_act", None) for m in modules}
    if len(acts) != 1 or None in acts:
        return None
    gate_up, gate_up_types, down, down_types, gate_up_bias, down_bias, max_rows = [], [], [], [], [], [], 1 << 62
    for m in modules:
        gu, dn = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        if not (isinstance(gu, BlockLinear) and isinstance(dn, BlockLinear) and gu.packed and dn.packed):
            return None
        if (
            len(dn.parts) != 1
            or len(gu.parts) != len(modules[0].gate_up_proj.parts)
            or (gu.bias is None) != (dn.bias is None)
        ):
            return None
        gate_up += gu._args[0]
        gate_up_types += gu._args[1]
        down += dn._args[0]
        down_types += dn._args[1]
        if gu.bias is not None:
            gate_up_bias.append(gu.bias.detach().float())
            down_bias.append(dn.bias.detach().float())
        max_rows = min(max_rows, gu._max_rows, dn._max_rows)
    gub = torch.stack(gate_up_bias).contiguous() if gate_up_bias else None  # [E, 2F]
    db = torch.stack(down_bias).contiguous() if down_bias else None  # [E, hidden]
    act, alpha, limit = acts.pop()
    checked = _blocks.ExpertSet(gate_up, gate_up_types, down, down_types, gub, db, act, float(alpha), float(limit))
    return checked, max_rows
