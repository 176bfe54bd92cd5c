"""Float weights into GGUF blocks, for ``--quantization`` on a Hugging Face folder (vLLM's
flag; the block layouts are llama.cpp's, so the kernels are the GGUF files' own):

- q8_0: per 32 values d = max|w| / 127 (stored float16), q = round(w / d): byte for byte
  what ``gguf`` and llama.cpp write;
- q4_0: ``gguf``'s own quantizer (llama.cpp's reference: d = max / -8);
- q4_k: per 32 values the range [min(w, 0), max(w)] in 16 steps, the 8 sub-block scales
  and minimums of a 256-value super-block in 6 bits against a float16 ``d`` / ``dmin``
  (llama.cpp's layout; its iterative error search is left out: a plain min/max fit).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from torch import nn

from engine.kernels.blocks import BlockLinear, BlockWeight

T = gguf.GGMLQuantizationType
SCHEMES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_k": T.Q4_K}


def _half_bytes(x: torch.Tensor) -> torch.Tensor:
    """float tensor [..., n] -> its float16 bytes [..., 2 n]."""
    return x.to(torch.float16).contiguous().view(torch.uint8)


def _round_away(x: torch.Tensor) -> torch.Tensor:
    return x.sign() * (x.abs() + 0.5).floor()


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K / 32 * 34] uint8 Q8_0 blocks."""
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // 32, 32)  # [N, B, 32]
    d = blocks.abs().amax(-1) / 127  # [N, B]
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = _round_away(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8)  # [N, B, 32]
    return torch.cat([_half_bytes(d[..., None]), q.view(torch.uint8)], dim=-1).reshape(n, -1)


def quantize_q4_0(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K / 32 * 18] uint8 Q4_0 blocks (``gguf``'s quantizer)."""
    raw = gguf.quants.quantize(w.detach().float().numpy(), T.Q4_0)  # [N, bytes]
    return torch.from_numpy(np.ascontiguousarray(raw))


def quantize_q4_k(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K / 256 * 144] uint8 Q4_K blocks (K a multiple of 256)."""
    n, k = w.shape
    x = w.detach().float().reshape(n, k // 256, 8, 32)  # [N, S, 8 sub-blocks, 32]
    lo = x.amin(-1).clamp(max=0)  # [N, S, 8]
    step = (x.amax(-1) - lo) / 15  # [N, S, 8]
    d = (step.amax(-1) / 63).half().float()  # [N, S]
    dmin = ((-lo).amax(-1) / 63).half().float()  # [N, S]
    sc = torch.where(d[..., None] > 0, step / d[..., None].clamp(min=1e-30), 0).round().clamp(0, 63)  # [N, S, 8]
    m = torch.where(dmin[..., None] > 0, -lo / dmin[..., None].clamp(min=1e-30), 0).round().clamp(0, 63)
    scale, offset = d[..., None] * sc, dmin[..., None] * m  # value = scale * q - offset
    q = torch.where(scale[..., None] > 0, (x + offset[..., None]) / scale[..., None].clamp(min=1e-30), 0)
    q = q.round().clamp(0, 15).to(torch.uint8)  # [N, S, 8, 32]
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    packed = torch.cat(
        [
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),  # bytes 0-3: scales 0-3, top bits of scales 4-7
            m[..., :4] | ((m[..., 4:] >> 4) << 6),  # bytes 4-7: mins 0-3, top bits of mins 4-7
            (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4),  # bytes 8-11: low bits of scales/mins 4-7
        ],
        dim=-1,
    )  # [N, S, 12]
    pairs = q.reshape(n, k // 256, 4, 2, 32)  # sub-blocks 2j (low nibbles) and 2j+1 (high)
    qs = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(n, k // 256, 128)  # [N, S, 128]
    header = torch.cat([_half_bytes(d[..., None]), _half_bytes(dmin[..., None])], dim=-1)  # [N, S, 4]
    return torch.cat([header, packed, qs], dim=-1).reshape(n, -1)


QUANTIZERS = {T.Q8_0: quantize_q8_0, T.Q4_0: quantize_q4_0, T.Q4_K: quantize_q4_k}


def quantize(w: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> BlockWeight:
    """A float weight [N, K] in ``qtype`` blocks (one of ``QUANTIZERS``)."""
    return BlockWeight(qtype, QUANTIZERS[qtype](w), w.shape[1])


def quantize_linears(model: nn.Module, scheme: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace, in place, every ``nn.Linear`` whose input width is a whole number of
    ``scheme``'s blocks (not the output head, as vLLM) by a ``BlockLinear``; returns how many."""
    qtype = SCHEMES[scheme]
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and child.in_features % values == 0 and name not in skip
    ]
    for parent, name, child in targets:
        layer = BlockLinear(child.in_features, [child.out_features], bias=child.bias is not None)
        layer.set_part(0, quantize(child.weight, qtype))
        if child.bias is not None:
            layer.bias = nn.Parameter(child.bias.detach().float(), requires_grad=False)
        setattr(parent, name, layer)
    return len(targets)
