"""Per-batch view of the paged KV cache: store this step's K/V, then attend.

Index tensors are built once per step (on first use) and shared by every layer:
each sequence's blocks are gathered whole (``index_select`` of contiguous
[block_size, kv_heads, head_dim] rows) into a padded [B, n_blocks_max * block_size]
buffer, so attention cost grows with the longest sequence in the batch, never with the
pool. Cells past a sequence's length inside its last block, and padding blocks, are
masked out by position.
"""

from __future__ import annotations

import itertools
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from memory.protocol import ForwardView, MemoryBatch

if TYPE_CHECKING:
    from memory.paged_kv import PagedKVCache

_FAR = 2**62  # position of padding: padded queries see everything, padded keys nothing


class AttentionLayout(NamedTuple):
    """One group of sequences attended in one SDPA call."""

    tokens: torch.Tensor | None  # [T_g] rows of the step's flat batch in this group; None: all, in order
    blocks: torch.Tensor  # [B_g * NB] physical block ids, sequence-major (padding: block 0)
    mask: torch.Tensor  # [B_g, 1, Q, L] bool, True = may attend
    q_rows: torch.Tensor | None  # [T_g] row of each token in the flattened [B_g * Q]; None when Q == 1


class PagedKVView(ForwardView):
    """Sequences that decode one token and sequences that prefill a chunk are attended
    in separate groups, so a decode row is never padded to a prefill chunk's length."""

    def __init__(self, cache: PagedKVCache, batch: MemoryBatch, slot_mapping: torch.Tensor):
        self.cache = cache
        self.batch = batch
        self.slot_mapping = slot_mapping.to(cache.device)  # [T]

    @cached_property
    def layouts(self) -> list[AttentionLayout]:
        n_tokens = self.batch.n_tokens
        starts = list(itertools.accumulate(n_tokens, initial=0))[:-1]
        decode = [i for i, n in enumerate(n_tokens) if n == 1]
        chunks = [i for i, n in enumerate(n_tokens) if n != 1]
        groups = [g for g in (decode, chunks) if g]
        if len(groups) == 1:
            return [self._layout(groups[0], None, starts)]
        rows = [torch.cat([torch.arange(starts[i], starts[i] + n_tokens[i]) for i in g]) for g in groups]
        return [self._layout(g, r.to(self.cache.device), starts) for g, r in zip(groups, rows)]

    def _layout(self, members: list[int], tokens: torch.Tensor | None, starts: list[int]) -> AttentionLayout:
        """``starts[i]``: first row of batch sequence ``i`` in the step's flat batch."""
        cache, batch = self.cache, self.batch
        bs = cache.block_size
        seqs = [batch.seq_ids[i] for i in members]
        n_new = [batch.n_tokens[i] for i in members]
        lengths = [cache.n[s] for s in seqs]
        n_seqs, n_q = len(seqs), max(n_new)
        n_blk = max(-(-n // bs) for n in lengths)
        blocks = torch.zeros(n_seqs, n_blk, dtype=torch.long)
        kv_pos = torch.full((n_seqs, n_blk * bs), _FAR + 1, dtype=torch.long)
        q_pos = torch.full((n_seqs, n_q), _FAR, dtype=torch.long)
        q_rows = []
        starts = [starts[i] for i in members]
        for j, seq in enumerate(seqs):
            table = cache.tables[seq][: -(-lengths[j] // bs)]
            blocks[j, : len(table)] = torch.tensor(table, dtype=torch.long)
            kv_pos[j, : lengths[j]] = cache.cell_pos[cache.cells(seq)]
            q_pos[j, : n_new[j]] = batch.positions[starts[j] : starts[j] + n_new[j]]
            q_rows.append(torch.arange(n_new[j]) + j * n_q)
        mask = (kv_pos[:, None, :] <= q_pos[:, :, None])[:, None]  # [B_g, 1, Q, L]
        dev = cache.device
        rows = torch.cat(q_rows).to(dev) if n_q > 1 else None
        return AttentionLayout(tokens, blocks.flatten().to(dev), mask.to(dev), rows)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]  # [cells, kv_heads, head_dim]
        k_cache.index_copy_(0, self.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, self.slot_mapping, v.to(v_cache.dtype))
        layouts = self.layouts
        if len(layouts) == 1:
            return self._attend_group(layouts[0], q, k_cache, v_cache)
        out = q.new_empty(q.shape)  # [T, H, D]
        for lay in layouts:
            out.index_copy_(0, lay.tokens, self._attend_group(lay, q.index_select(0, lay.tokens), k_cache, v_cache))
        return out

    def _attend_group(
        self, lay: AttentionLayout, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """q: [T_g, H, D] -> attention output [T_g, H, D] for one group."""
        n_seqs, n_q = lay.mask.shape[0], lay.mask.shape[2]
        n_tok, n_heads, head_dim = q.shape
        if lay.q_rows is None:
            qp = q.reshape(n_seqs, 1, n_heads, head_dim)  # [B, 1, H, D]
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
        return out if lay.q_rows is None else out[lay.q_rows]  # [T_g, H, D]
