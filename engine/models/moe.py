"""Sparse mixtures of experts: a router picks ``top_k`` experts per token, each a gated
MLP, and their outputs are summed with the router's weights.

``SparseMoE`` (Granite): the softmax of the chosen logits as weights; experts stored
fused 3-D as in Granite checkpoints: ``input_linear.weight`` [E, 2 * ffn, hidden] (gate
rows, then up rows) and ``output_linear.weight`` [E, hidden, ffn]; the router is
``router.layer.weight`` [E, hidden]. ``SharedExpertMoE`` (Qwen2-MoE, Qwen3-Next,
Qwen3.5-MoE; Qwen3-MoE without its shared part): experts one by one, plus a gated
shared expert. Tokens are grouped by expert, so each
expert runs one matmul over the tokens that chose it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import moe_kernel
from engine.models import rowwise
from engine.models.layers import GatedMLP


class TopKRouter(nn.Module):
    def __init__(self, hidden: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.layer = rowwise.Linear(hidden, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        fused = moe_kernel.route(x, self.layer, self.top_k, "topk_softmax")
        if fused is not None:
            return fused
        logits = self.layer(x).float()  # [T, E]
        top, idx = logits.topk(self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).type_as(x), idx


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, n_experts: int, top_k: int):
        super().__init__()
        self.router = TopKRouter(hidden, n_experts, top_k)
        self.input_linear = nn.Module()
        self.input_linear.weight = nn.Parameter(torch.zeros(n_experts, 2 * ffn, hidden))
        self.output_linear = nn.Module()
        self.output_linear.weight = nn.Parameter(torch.zeros(n_experts, hidden, ffn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        weights, idx = self.router(x)  # [T, k]
        return run_stacked_experts(x, self.input_linear.weight, self.output_linear.weight, weights, idx, F.silu)


def run_stacked_experts(x, gate_up, down, weights, idx, act) -> torch.Tensor:
    """Experts stacked 3-D: x [T, hidden]; gate_up [E, 2F, hidden] (gate rows, then up);
    down [E, hidden, F]; weights, idx [T, k] -> [T, hidden], each chosen expert one
    matmul over its tokens (Granite's experts, Gemma 4's)."""
    out = torch.zeros_like(x)
    ffn = down.shape[-1]
    for e in idx.unique().tolist():
        rows, pos = torch.where(idx == e)
        gate, up = rowwise.linear(x[rows], gate_up[e]).split(ffn, dim=-1)
        h = rowwise.linear(act(gate) * up, down[e])  # [n, hidden]
        out.index_add_(0, rows, h * weights[rows, pos, None].to(h.dtype))
    return out


def run_experts(x: torch.Tensor, experts: nn.ModuleList, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x: [T, hidden]; weights, idx: [T, k] -> the weighted sum of each token's experts
    [T, hidden]. Grouped by expert: the (token, expert) pairs sorted by expert once, each
    chosen expert runs over its run of them, and one ``index_add_`` sums each token's in
    expert order (one token: its experts in turn, nothing gathered, summed in the same
    order, so a token's bits do not depend on the batch). Packed experts: the compiled
    call of engine/kernels/moe_kernel.py, the same grouping and order."""
    fused = moe_kernel.experts(x, experts, weights, idx)
    if fused is not None:
        return fused
    out = torch.zeros_like(x)
    if x.shape[0] == 1:
        for e, w in sorted(zip(idx[0].tolist(), weights[0].tolist())):
            out += experts[e](x) * w
        return out
    flat = idx.flatten()  # [T * k]
    order = torch.argsort(flat, stable=True)  # the pairs by expert, then by token
    tokens = order // idx.shape[1]  # [T * k] each pair's token
    picked = x.index_select(0, tokens)  # [T * k, hidden]
    parts, start = [], 0
    for e, n in enumerate(torch.bincount(flat, minlength=len(experts)).tolist()):
        if n:
            parts.append(experts[e](picked[start : start + n]))  # [n, hidden]
            start += n
    h = torch.cat(parts) * weights.flatten()[order, None].to(x.dtype)  # [T * k, hidden]
    return out.index_add_(0, tokens, h)


def split_fused_experts(name: str, tensor: torch.Tensor):
    """transformers 5's stacked experts (``experts.gate_up_proj`` [E, 2F, H],
    ``experts.down_proj`` [E, H, F], as Qwen3.5-MoE checkpoints are published) -> the
    (name, tensor) pairs of experts stored one by one; any other tensor as it is."""
    for kind in ("gate_up_proj", "down_proj"):
        if name.endswith((f".experts.{kind}", f".experts.{kind}.weight")):  # (not shared_experts.<kind>)
            base = name[: name.rindex(f".experts.{kind}")] + ".experts"
            for e, w in enumerate(tensor):
                if kind == "down_proj":
                    yield f"{base}.{e}.down_proj.weight", w
                else:
                    gate, up = w.chunk(2, dim=0)
                    yield f"{base}.{e}.gate_proj.weight", gate
                    yield f"{base}.{e}.up_proj.weight", up
            return
    yield name, tensor


class SharedExpertMoE(nn.Module):
    """Qwen2-MoE style (Qwen3-Next, Qwen3.5-MoE): the softmax over all experts, its
    top-k (renormalized to sum 1 when ``norm_topk``), plus a shared expert scaled by
    sigmoid(shared_expert_gate(x)). Names as in the checkpoints: ``gate`` (the router),
    ``experts.<e>.{gate,up,down}_proj``, ``shared_expert``, ``shared_expert_gate``."""

    def __init__(self, hidden: int, ffn: int, shared_ffn: int, n_experts: int, top_k: int, norm_topk: bool):
        super().__init__()
        self.top_k, self.norm_topk = top_k, norm_topk
        self.gate = rowwise.Linear(hidden, n_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(hidden, ffn) for _ in range(n_experts))
        if shared_ffn:  # none: Qwen3-MoE's routed experts alone
            self.shared_expert = GatedMLP(hidden, shared_ffn)
            self.shared_expert_gate = rowwise.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        fused = moe_kernel.route(x, self.gate, self.top_k, "softmax_topk_norm" if self.norm_topk else "softmax_topk")
        if fused is not None:
            weights, idx = fused
        else:
            probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
            weights, idx = probs.topk(self.top_k, dim=-1)  # [T, k]
            if self.norm_topk:
                weights = weights / weights.sum(-1, keepdim=True)
        out = run_experts(x, self.experts, weights.to(x.dtype), idx)
        if not hasattr(self, "shared_expert"):
            return out
        return out + rowwise.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class SigmoidRouter(nn.Module):
    """DeepSeek-V3's router (Nemotron-H, GLM-4 MoE): sigmoid scores; experts chosen by
    the scores plus ``e_score_correction_bias``, within the ``topk_group`` best of
    ``n_group`` groups (a group scored by its two best); the chosen scores renormalized
    where ``norm_topk_prob`` and scaled by ``routed_scaling_factor``. Names as the
    checkpoints': ``weight``, ``e_score_correction_bias``."""

    def __init__(self, raw: dict, hidden: int):
        super().__init__()
        n = int(raw["n_routed_experts"])
        self.weight = nn.Parameter(torch.zeros(n, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(n))
        self.top_k, self.groups = int(raw["num_experts_per_tok"]), int(raw.get("n_group") or 1)
        self.top_groups = int(raw.get("topk_group") or 1)
        self.norm, self.scale = bool(raw.get("norm_topk_prob", True)), float(raw.get("routed_scaling_factor") or 1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] float32, expert ids [T, k])."""
        scores = rowwise.sigmoid(rowwise.linear(x.float(), self.weight.float()))  # [T, E]
        steer = scores + self.e_score_correction_bias.float()
        if self.groups > 1:
            grouped = steer.view(len(x), self.groups, -1)  # [T, G, E / G]
            best = grouped.topk(2, dim=-1).values.sum(-1).topk(self.top_groups, dim=-1).indices  # [T, topk_group]
            keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)  # [T, G]
            steer = steer.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        idx = steer.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, idx)
        if self.norm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, idx
