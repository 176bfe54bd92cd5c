"""A Llama-family decoder layer whose four projections are all packed (GGUF blocks
repacked at load), run as two compiled calls around attention instead of ~40 eager ops
and module calls: ``layer_qkv`` (RMSNorm, the fused q/k/v projection, rotary) and
``layer_out`` (o projection + residual, RMSNorm, gated MLP + residual), both in
engine/kernels/csrc/binding.cpp. Attention itself stays with memory's view (store, read,
the decode kernel), so every cache layout keeps working. The same kernels in the same
order as the eager path: the results are bit for bit the eager path's.

The model definition stays one (engine/models/layers.py); this only reads its modules.
"""

from __future__ import annotations

import torch

from engine.kernels.blocks import BlockLinear

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None

enabled = True  # False: the eager path (tests compare the two)


def _packed(m: object, rows: int) -> bool:
    return isinstance(m, BlockLinear) and m.bias is None and m.packed and rows < m._max_rows


def run_packed_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view) -> torch.Tensor | None:
    """``layer``'s output for x [T, hidden] through the two compiled calls, or None where
    it cannot take them (no extension, a projection not packed or with a bias or LoRA,
    q/k norms, float types other than float32): the caller runs the eager layer."""
    if _blocks is None or not enabled or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
        return None
    attn, mlp, rows = layer.self_attn, layer.mlp, x.shape[0]
    if not hasattr(mlp, "gate_up_proj") or attn.s.rotary_dim not in (0, attn.s.head_dim):  # experts; partial rotary
        return None
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if attn.s.qk_norm or not all(_packed(m, rows) for m in projections) or cos.dtype != torch.float32:
        return None
    s, norm1, norm2 = attn.s, layer.input_layernorm, layer.post_attention_layernorm
    q, k, v = _blocks.layer_qkv(x, norm1.weight, norm1.eps, *attn.qkv_proj._args, s.n_heads, s.n_kv_heads, cos, sin)
    out = attn.attend(view, q, k, v)  # [T, H, D]
    return _blocks.layer_out(
        x, out, *attn.o_proj._args, norm2.weight, norm2.eps, *mlp.gate_up_proj._args, *mlp.down_proj._args
    )  # [T, hidden]
