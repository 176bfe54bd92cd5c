"""Decode attention through block tables (memory/attention/decode_tables.py): one query
row per sequence, every shape fixed by the batch size, the lengths and tables read from
device tensors, so that a CUDA graph captured once replays for any lengths.

On CUDA with Triton: one kernel (engine/kernels/triton_decode.py), whose work grows
with each row's own length. Elsewhere (the CPU, where the same static decode step runs
eagerly and is tested; CUDA without Triton): torch ops over the table's whole width,
masked by length; the same function, with work that grows with the table's width.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

try:
    from engine.kernels.triton_decode import triton_decode_attention
except ImportError:  # no Triton (the CPU build): the torch path below
    triton_decode_attention = None


class TableLayout(NamedTuple):
    """The strides of memory/attention/decode_tables.py's formula, in flat rows."""

    block: int
    stride_block: int
    stride_head: int
    stride_cell: int


def key_rows(table: torch.Tensor, n_kv_heads: int, lay: TableLayout) -> torch.Tensor:
    """table [B, NB] -> flat row of every (row, KV head, key) [B, KVH, NB * block]."""
    n_rows, n_blocks = table.shape
    cell = torch.arange(n_blocks * lay.block, device=table.device)  # [L]
    base = table.long()[:, cell // lay.block] * lay.stride_block + (cell % lay.block) * lay.stride_cell  # [B, L]
    heads = torch.arange(n_kv_heads, device=table.device) * lay.stride_head  # [KVH]
    return base[:, None, :] + heads[None, :, None]  # [B, KVH, L]


def table_attention(q: torch.Tensor, *args) -> torch.Tensor:
    """``reference_table_attention``'s function (its arguments), by the Triton kernel on
    CUDA where Triton imports, else by the torch ops themselves."""
    if triton_decode_attention is not None and q.is_cuda:
        return triton_decode_attention(q, *args)
    return reference_table_attention(q, *args)


def reference_table_attention(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    n_kv_heads: int,
    lay: TableLayout,
    scale: float,
) -> torch.Tensor:
    """q [B, H, D] (H a multiple of ``n_kv_heads``); k_rows, v_rows [R, D] a layer's
    caches as flat rows; table [B, NB] and lens [B] int32 or int64 on q's device (either
    may be strided). Row b attends to its keys 0 .. lens[b] - 1 -> [B, H, D] in q's
    dtype. In torch ops, with work over the table's whole width."""
    n_rows, n_heads, head_dim = q.shape
    idx = key_rows(table, n_kv_heads, lay)  # [B, KVH, L]
    keys = k_rows.index_select(0, idx.flatten()).view(*idx.shape, head_dim)  # [B, KVH, L, D]
    values = v_rows.index_select(0, idx.flatten()).view(*idx.shape, head_dim)
    allowed = torch.arange(idx.shape[-1], device=q.device)[None, :] < lens.long()[:, None]  # [B, L]
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
    qg = q.view(n_rows, n_kv_heads, n_heads // n_kv_heads, head_dim)  # [B, KVH, G, D]
    mask = mask[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(qg, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale)
    return out.reshape(n_rows, n_heads, head_dim)  # head h reads KV head h // G
