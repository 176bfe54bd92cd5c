"""Attention written out as matmuls and a softmax, for what SDPA cannot do: Gemma 2's
soft-capped scores and gpt-oss's sink logits. Used by the prompt path of every KV view
(memory/attention/kv_view.py); decode steps take the compiled kernel, which does both."""

from __future__ import annotations

import torch


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention SDPA cannot do: soft-capped scores (Gemma 2), a sink logit per head
    (gpt-oss: one more column in the softmax, dropped after it).
    q: [B, H, Q, D]; k, v: [B, KVH, L, D]; mask: [B, 1, Q, L] additive -> [B, H, Q, D]."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [B, H, L, D]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, Q, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = (scores + mask).float()
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)  # [B, H, Q, 1]
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(q.dtype), v)
