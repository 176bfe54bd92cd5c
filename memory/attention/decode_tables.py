"""Where a decode batch's keys lie, as block tables: what a fixed-shape decode step
(engine/core/static_decode.py, captured once and replayed) needs to read and write a
full-attention cache through device buffers instead of per-step view tensors.

Both full-size layouts read as one formula. A layer's K (or V) cache is seen as flat
rows [R, D], one KV head's key per row; key ``j`` (0 <= j < lens[b]) of batch row
``b``, KV head ``h``, is row

    table[b, j // block] * stride_block + h * stride_head + (j % block) * stride_cell

- unified pool (paged_kv.py, storage [cells, KVH, D]): the sequence's block table,
  ``block`` = block size, strides (block * KVH, 1, KVH);
- per-stream (stream_kv.py, storage [S, KVH, C, D]): a one-entry table (the stream),
  ``block`` = C, strides (KVH * C, C, 1).

A decode row attends to every cell its sequence holds: with full attention every
stored position is at or before the new token's (the cells hold the sequence's
positions; a context shift moves them all down together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeTables:
    table: torch.Tensor  # [B, n_blocks] int64 (CPU): blocks of each row's sequence, in order (0-padded)
    lens: torch.Tensor  # [B] int64: cells each row attends to, its new token's included
    write_rows: torch.Tensor  # [B] int64: the flat row (KV head 0) the new token's key goes to
    block: int  # cells per table entry
    stride_block: int  # flat rows between consecutive blocks' first cells
    stride_head: int  # ... between KV heads
    stride_cell: int  # ... between cells of a block


def flat_rows(cache: torch.Tensor) -> torch.Tensor:
    """A K or V cache tensor [..., D] as the flat rows [R, D] the strides count (a view)."""
    return cache.view(-1, cache.shape[-1])
