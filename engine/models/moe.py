"""Sparse mixture of experts: a router picks ``top_k`` experts per token, each a gated
MLP; outputs are summed with the softmax of the chosen logits as weights.

Experts are stored as in Granite checkpoints, fused 3-D: ``input_linear.weight``
[E, 2 * ffn, hidden] (gate rows, then up rows) and ``output_linear.weight``
[E, hidden, ffn]; the router is ``router.layer.weight`` [E, hidden]. Tokens are
grouped by expert, so each expert runs one matmul over the tokens that chose it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TopKRouter(nn.Module):
    def __init__(self, hidden: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.layer = nn.Linear(hidden, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        logits = self.layer(x).float()  # [T, E]
        top, idx = logits.topk(self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).type_as(x), idx


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, n_experts: int, top_k: int):
        super().__init__()
        self.ffn = ffn
        self.router = TopKRouter(hidden, n_experts, top_k)
        self.input_linear = nn.Module()
        self.input_linear.weight = nn.Parameter(torch.zeros(n_experts, 2 * ffn, hidden))
        self.output_linear = nn.Module()
        self.output_linear.weight = nn.Parameter(torch.zeros(n_experts, hidden, ffn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        weights, idx = self.router(x)  # [T, k]
        out = torch.zeros_like(x)
        flat = idx.flatten()  # [T * k]
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.input_linear.weight.shape[0]).tolist()
        tokens = order // idx.shape[1]  # [T * k] token of each (token, choice), grouped by expert
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            sel = order[start : start + n]
            rows = tokens[start : start + n]
            start += n
            gate, up = F.linear(x[rows], self.input_linear.weight[expert]).split(self.ffn, dim=-1)
            h = F.linear(F.silu(gate) * up, self.output_linear.weight[expert])  # [n, hidden]
            out.index_add_(0, rows, h * weights.flatten()[sel, None])
        return out
