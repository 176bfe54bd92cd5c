"""Attention written out as matmuls and a softmax, for what SDPA cannot do: Gemma 2's
soft-capped scores and gpt-oss's sink logits. Used by the prompt path of every KV view
(memory/attention/kv_view.py); decode steps take the compiled kernel, which does both.

Sinks on the CPU in float32 take torch's flash attention kernel instead, which also
returns each row's log-sum-exp: a sink adds e^sink to the softmax's denominator, so the
sunk output is the plain one times Z / (Z + e^sink) = sigmoid(lse - sink). 512 rows of 16
heads: ~6 against ~24 ms a layer (measured, 2-core Sapphire Rapids-class Xeon).
"""

from __future__ import annotations

import torch

# torch's CPU flash attention with its log-sum-exp (torch is pinned: see pyproject.toml)
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


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
    if sinks is not None and softcap is None and _FLASH is not None and q.device.type == "cpu":
        if q.dtype == k.dtype == mask.dtype == torch.float32:
            out, lse = _FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)  # [B, H, Q, D], [B, H, Q]
            return out * torch.sigmoid(lse - sinks.float().view(1, -1, 1)).unsqueeze(-1)
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
