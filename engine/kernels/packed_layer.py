"""A Llama-family decoder layer whose attention projections are packed (GGUF blocks
repacked at load), run as compiled calls around attention instead of ~40 eager ops and
module calls: ``layer_qkv`` (RMSNorm, the fused q/k/v projection and its bias, rotary),
then, with a packed gated MLP, ``layer_out`` (o projection and bias + residual, RMSNorm,
the MLP + residual); with any other MLP (a mixture of experts: gpt-oss, Qwen2-MoE),
``layer_attn_out`` (o projection and bias + residual, RMSNorm), the MLP module itself,
and the residual. Attention itself stays with the module's ``attend`` and memory's view
(store, read, the decode kernel, sinks), so every cache layout keeps working. The same
kernels in the same order as the eager path: the results are bit for bit the eager
path's.

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
    return (
        isinstance(m, BlockLinear)
        and m.packed
        and rows < m._max_rows
        and (m.bias is None or m.bias.dtype == torch.float32)
    )


def run_packed_layer(
    layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view, dense: bool
) -> torch.Tensor | None:
    """``layer``'s output for x [T, hidden] through the compiled calls, or None where it
    cannot take them (no extension, an attention projection not packed or with LoRA, q/k
    norms, partial rotary, float types other than float32): the caller runs the eager
    layer. The caller vouches for the structure: RMSNorms, layers.py's attention forward
    (its ``attend`` may differ), and with ``dense`` its GatedMLP."""
    if _blocks is None or not enabled or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
        return None
    attn, mlp, rows = layer.self_attn, layer.mlp, x.shape[0]
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    s = attn.s
    if s.qk_norm or s.rotary_dim not in (0, s.head_dim) or cos.dtype != torch.float32:
        return None
    if not (_packed(attn.qkv_proj, rows) and _packed(attn.o_proj, rows)):
        return None
    q, k, v = _blocks.layer_qkv(
        x, norm1.weight, norm1.eps, *attn.qkv_proj._args, s.n_heads, s.n_kv_heads, cos, sin, attn.qkv_proj.bias
    )  # [T, H, D], [T, KVH, D] x2
    out = attn.attend(view, q, k, v)  # [T, H, D]
    o = attn.o_proj
    if dense and _packed(mlp.gate_up_proj, rows) and _packed(mlp.down_proj, rows):
        gu, down = mlp.gate_up_proj, mlp.down_proj
        return _blocks.layer_out(
            x, out, *o._args, o.bias, norm2.weight, norm2.eps, *gu._args, gu.bias, *down._args, down.bias
        )  # [T, hidden]
    h, normed = _blocks.layer_attn_out(x, out, *o._args, o.bias, norm2.weight, norm2.eps)  # [T, hidden] x2
    return mlp(normed).add_(h)  # [T, hidden]
