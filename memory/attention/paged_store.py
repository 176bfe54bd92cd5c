"""Paged storage for attention layers: K/V tensors, block tables, cell positions.

Storage per attention layer: K and V of shape [n_blocks * block_size, kv_heads, head_dim];
cell ``c`` lives in block ``c // block_size``. Each sequence owns a block table (list of
block ids) and a count ``n`` of cells in use; logical cell ``j`` of the sequence is
``table[j // bs] * bs + j % bs``. Blocks are reference-counted; each physical cell
carries its position in ``cell_pos``. This is the data both the cache (``paged_kv``:
the protocol's operations) and the per-step view (``kv_view``: attention) work on.
"""

from __future__ import annotations

import torch

from memory.attention.block_pool import BlockPool
from memory.attention.kv_state import NO_POS
from memory.attention.lazy_zeros import lazy_zeros
from memory.protocol import CacheFull
from memory.spec import LayerSpec, bytes_per_cell, window_of


def n_blocks_for(n_cells: int, bs: int) -> int:
    return -(-n_cells // bs)


class PagedStore:
    def __init__(
        self,
        layer_specs: dict[int, LayerSpec],
        n_blocks: int,
        n_seq_max: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
    ):
        if block_size <= 0 or n_seq_max <= 0:
            raise ValueError("block_size and n_seq_max must be positive")
        self.block_size = block_size
        self.n_seq_max = n_seq_max
        self.device = torch.device(device)
        self.specs = dict(layer_specs)
        self.windows = {layer: w for layer, s in self.specs.items() if (w := window_of(s)) is not None}
        self.pool = BlockPool(n_blocks)
        n_cells = n_blocks * block_size
        store = lambda s, kv: lazy_zeros(  # noqa: E731
            s.stored_shape(kv, n_cells, s.n_kv_heads), s.codec_of(kv).storage, self.device
        )
        self.k = {layer: store(s, "k") for layer, s in self.specs.items()}
        self.v = {layer: store(s, "v") for layer, s in self.specs.items()}
        # layer -> [cells, kv_heads, stored row] (memory/kv_codec.py); committed as cells are first written
        self.cell_pos = torch.full((n_cells,), NO_POS, dtype=torch.long)  # bookkeeping, on CPU
        self.tables: list[list[int]] = [[] for _ in range(n_seq_max)]
        self.n: list[int] = [0] * n_seq_max

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * bytes_per_cell(self.specs.values())

    # ---- helpers -------------------------------------------------------------------

    def cells(self, seq: int, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Physical cell ids of ``seq``'s logical cells [start, end) -> [n] int64."""
        end = self.n[seq] if end is None else end
        if end <= start:
            return torch.empty(0, dtype=torch.long)
        bs = self.block_size
        table = torch.tensor(self.tables[seq][start // bs : n_blocks_for(end, bs)], dtype=torch.long)
        cells = (table[:, None] * bs + torch.arange(bs)).flatten()  # [blocks * bs]
        off = start - (start // bs) * bs
        return cells[off : off + end - start]

    def _positions(self, seq: int) -> torch.Tensor:
        return self.cell_pos[self.cells(seq)]

    def _release_blocks(self, seq: int, first_block: int = 0) -> None:
        for b in self.tables[seq][first_block:]:
            self.pool.release(b)
        del self.tables[seq][first_block:]

    def _private_after_release(self, seq: int, first_block: int) -> int:
        """Blocks that releasing ``seq``'s table from ``first_block`` would free."""
        return sum(1 for b in self.tables[seq][first_block:] if self.pool.refcount[b] == 1)

    def _rewrite_from(self, seq: int, j0: int, src_cells: torch.Tensor) -> None:
        """Make ``seq``'s cells from logical index ``j0`` on a copy of ``src_cells``.

        Rewrites from the block boundary at or before ``j0`` into fresh blocks, so
        shared blocks are never written. All-or-nothing.
        """
        bs = self.block_size
        b0 = j0 // bs
        src = torch.cat([self.cells(seq, b0 * bs, j0), src_cells])  # [m]
        need = n_blocks_for(len(src), bs)
        if need > self.pool.n_free + self._private_after_release(seq, b0):
            raise CacheFull(f"rewriting sequence {seq} needs {need} blocks")
        dev_src = src.to(self.device)
        saved_k = {layer: self.k[layer][dev_src] for layer in self.specs}  # indexing copies
        saved_v = {layer: self.v[layer][dev_src] for layer in self.specs}
        saved_pos = self.cell_pos[src]
        self._release_blocks(seq, b0)
        self.tables[seq] += self.pool.allocate(need)
        self.n[seq] = b0 * bs + len(src)
        dst = self.cells(seq, b0 * bs)
        dev_dst = dst.to(self.device)
        for layer in self.specs:
            self.k[layer][dev_dst] = saved_k[layer]
            self.v[layer][dev_dst] = saved_v[layer]
        self.cell_pos[dst] = saved_pos
