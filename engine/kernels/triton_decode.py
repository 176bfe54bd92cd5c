"""Decode attention through block tables in Triton (CUDA): flash-decoding. Each program
takes one (row, KV head, split of the row's keys): the G query heads of that KV head
against its keys in blocks of ``N``, with an online softmax; a second kernel merges the
splits. The grid depends on the batch size alone (lengths are read on the device), so
a captured CUDA graph replays it for any lengths; a split past a row's length does no
work. Importing this module without Triton raises ImportError (the torch path runs).

Checked on the CPU by Triton's interpreter (``TRITON_INTERPRET=1``, tests/test_static_decode.py)
and on the GPU by bench/gpu_check.sh.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KEYS_PER_STEP = 64  # keys of one inner iteration (N)
TARGET_PROGRAMS = 264  # about two per multiprocessor of an H100 (132)
MAX_SPLITS = 32


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, acc_ptr, ml_ptr,
    stride_table, stride_lens, n_splits, scale, n_heads,
    stride_block, stride_head, stride_cell,
    BLOCK: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    N: tl.constexpr, SP: tl.constexpr,
):  # fmt: skip
    b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_keys = tl.load(lens_ptr + b * stride_lens).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(n_keys, n_splits), N) * N  # keys per split, whole steps
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, n_keys)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    g_ok, d_ok = g < G, d < D
    heads = kvh * G + g  # [GP]
    q_off = (b * n_heads + heads)[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # [GP, DP]
    m = tl.full([GP], float("-inf"), tl.float32)
    s_sum = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    start = lo
    while start < hi:  # (a while loop: Triton's interpreter cannot range over loaded bounds)
        j = start + tl.arange(0, N)  # [N]
        j_ok = j < hi
        blk = tl.load(table_ptr + b * stride_table + j // BLOCK, mask=j_ok, other=0).to(tl.int64)
        row = blk * stride_block + kvh * stride_head + (j % BLOCK).to(tl.int64) * stride_cell  # [N]
        kv_off = row[:, None] * D + d[None, :]
        kv_ok = j_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_ok, other=0.0)  # [N, DP]
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [GP, N] float32
        s = tl.where(j_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s_sum = s_sum * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=kv_ok, other=0.0)  # [N, DP]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new
        start += N
    out_row = (b * n_heads + heads) * SP + sp  # [GP]
    tl.store(acc_ptr + out_row[:, None] * DP + d[None, :], acc, mask=g_ok[:, None])
    tl.store(ml_ptr + out_row * 2, m, mask=g_ok)
    tl.store(ml_ptr + out_row * 2 + 1, s_sum, mask=g_ok)


@triton.jit
def _merge_kernel(acc_ptr, ml_ptr, out_ptr, n_splits, D: tl.constexpr, DP: tl.constexpr, SP: tl.constexpr):
    bh = tl.program_id(0)  # row * H + head
    sp = tl.arange(0, SP)
    d = tl.arange(0, DP)
    sp_ok = sp < n_splits
    m = tl.load(ml_ptr + (bh * SP + sp) * 2, mask=sp_ok, other=float("-inf"))  # [SP]
    s_sum = tl.load(ml_ptr + (bh * SP + sp) * 2 + 1, mask=sp_ok, other=0.0)
    top = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)  # empty splits weigh nothing
    acc = tl.load(acc_ptr + (bh * SP + sp)[:, None] * DP + d[None, :], mask=sp_ok[:, None], other=0.0)  # [SP, DP]
    out = tl.sum(acc * w[:, None], 0) / tl.sum(s_sum * w, 0)  # [DP]
    tl.store(out_ptr + bh * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def n_splits_for(n_rows: int, n_kv_heads: int) -> int:
    """Splits of each row's keys: enough programs to fill the GPU at small batches."""
    return max(1, min(MAX_SPLITS, -(-TARGET_PROGRAMS // (n_rows * n_kv_heads))))


def triton_decode_attention(q, k_rows, v_rows, table, lens, n_kv_heads, lay, scale) -> torch.Tensor:
    """engine/kernels/table_attention.py's ``table_attention`` (its arguments), in two
    launches; ``table`` and ``lens`` may be strided (columns of the static step buffer)."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // n_kv_heads
    splits = n_splits_for(n_rows, n_kv_heads)
    sp, dp = triton.next_power_of_2(splits), triton.next_power_of_2(head_dim)
    gp = max(16, triton.next_power_of_2(group))  # tl.dot's least row count
    q = q.contiguous()
    acc = torch.empty(n_rows * n_heads * sp, dp, dtype=torch.float32, device=q.device)  # [B * H * SP, DP]
    ml = torch.empty(n_rows * n_heads * sp, 2, dtype=torch.float32, device=q.device)  # (max, sum) per split
    _split_kernel[(n_rows, n_kv_heads, splits)](
        q, k_rows, v_rows, table, lens, acc, ml,
        table.stride(0), lens.stride(0), splits, scale, n_heads,
        lay.stride_block, lay.stride_head, lay.stride_cell,
        BLOCK=lay.block, G=group, GP=gp, D=head_dim, DP=dp, N=KEYS_PER_STEP, SP=sp,
    )  # fmt: skip
    out = torch.empty_like(q)
    _merge_kernel[(n_rows * n_heads,)](acc, ml, out, splits, D=head_dim, DP=dp, SP=sp)
    return out  # [B, H, D]
