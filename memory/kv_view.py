"""Per-batch view of the paged KV cache: store this step's K/V, then attend.

Index tensors are built once per step (on first use) and shared by every layer:
each sequence's blocks are gathered whole (``index_select`` of contiguous
[block_size, kv_heads, head_dim] rows) into a padded [B, n_blocks_max * block_size]
buffer, so attention cost grows with the longest sequence in the batch, never with the
pool. Cells past a sequence's length inside its last block, and padding blocks, are
masked out by position.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from memory.protocol import ForwardView, MemoryBatch

if TYPE_CHECKING:
    from memory.paged_kv import PagedKVCache

_FAR = 2**62  # position of padding: padded queries see everything, padded keys nothing


class AttentionLayout(NamedTuple):
    blocks: torch.Tensor  # [B * NB] physical block ids, sequence-major (padding: block 0)
    mask: torch.Tensor  # [B, 1, Q, L] bool, True = may attend
    q_rows: torch.Tensor | None  # [T] row of each token in the flattened [B * Q]; None when Q == 1


class PagedKVView(ForwardView):
    def __init__(self, cache: PagedKVCache, batch: MemoryBatch, slot_mapping: torch.Tensor):
        self.cache = cache
        self.batch = batch
        self.slot_mapping = slot_mapping.to(cache.device)  # [T]

    @cached_property
    def layout(self) -> AttentionLayout:
        cache, batch = self.cache, self.batch
        bs = cache.block_size
        lengths = [cache.n[s] for s in batch.seq_ids]
        n_seqs, n_q = len(lengths), max(batch.n_tokens)
        n_blk = max(-(-n // bs) for n in lengths)
        blocks = torch.zeros(n_seqs, n_blk, dtype=torch.long)
        kv_pos = torch.full((n_seqs, n_blk * bs), _FAR + 1, dtype=torch.long)
        q_pos = torch.full((n_seqs, n_q), _FAR, dtype=torch.long)
        q_rows = []
        start = 0
        for i, (seq, n_new) in enumerate(zip(batch.seq_ids, batch.n_tokens)):
            table = cache.tables[seq][: -(-lengths[i] // bs)]
            blocks[i, : len(table)] = torch.tensor(table, dtype=torch.long)
            kv_pos[i, : lengths[i]] = cache.cell_pos[cache.cells(seq)]
            q_pos[i, :n_new] = batch.positions[start : start + n_new]
            q_rows.append(torch.arange(n_new) + i * n_q)
            start += n_new
        mask = (kv_pos[:, None, :] <= q_pos[:, :, None])[:, None]  # [B, 1, Q, L]
        dev = cache.device
        rows = torch.cat(q_rows).to(dev) if n_q > 1 else None
        return AttentionLayout(blocks.flatten().to(dev), mask.to(dev), rows)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]  # [cells, kv_heads, head_dim]
        k_cache.index_copy_(0, self.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, self.slot_mapping, v.to(v_cache.dtype))
        lay = self.layout
        n_seqs, n_q = lay.mask.shape[0], lay.mask.shape[2]
        n_tok, n_heads, head_dim = q.shape
        if lay.q_rows is None:
            qp = q.view(n_seqs, 1, n_heads, head_dim)  # [B, 1, H, D]
        else:
            qp = q.new_zeros(n_seqs * n_q, n_heads, head_dim)
            qp[lay.q_rows] = q
            qp = qp.view(n_seqs, n_q, n_heads, head_dim)  # [B, Q, H, D]
        bs, n_kv = self.cache.block_size, lay.mask.shape[-1]
        kv_shape = (n_seqs, n_kv, k_cache.shape[1], head_dim)
        by_block = (-1, bs, *kv_shape[2:])  # [blocks, bs, KVH, D]
        keys = k_cache.view(by_block).index_select(0, lay.blocks).view(kv_shape).to(q.dtype)  # [B, L, KVH, D]
        values = v_cache.view(by_block).index_select(0, lay.blocks).view(kv_shape).to(q.dtype)  # [B, L, KVH, D]
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=lay.mask,
            enable_gqa=True,
        )  # [B, H, Q, D]
        out = out.transpose(1, 2).reshape(n_seqs * n_q, n_heads, head_dim)
        return out if lay.q_rows is None else out[lay.q_rows]  # [T, H, D]
