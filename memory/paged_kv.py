"""Unified KV cache on paged storage: one block pool shared by every sequence.

Storage per attention layer: K and V of shape [n_blocks * block_size, kv_heads, head_dim];
cell ``c`` lives in block ``c // block_size``. Each sequence owns a block table (list of
block ids) and a count ``n`` of cells in use; logical cell ``j`` of the sequence is
``table[j // bs] * bs + j % bs``. Blocks are reference-counted: a prefix ``seq_cp``
shares blocks, and any write into a block whose count is above one copies it first
(copy-on-write). Each physical cell carries its position in ``cell_pos``; shared cells
always agree on it because shifting a shared block copies it first.

Keys are stored rotated; ``seq_add`` re-rotates them through the ``rope_shift`` hook
given by the engine (memory imports no model code).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memory.block_pool import BlockPool
from memory.kv_view import PagedKVView
from memory.protocol import (
    CacheFull,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.spec import FullAttentionSpec

RopeShift = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
"""rope_shift(layer, k [N, kv_heads, head_dim], delta [N]) -> k rotated by delta."""

_NO_POS = -(2**62)


def _n_blocks_for(n_cells: int, bs: int) -> int:
    return -(-n_cells // bs)


class PagedKVCache(Memory):
    kind = "kv_unified"

    def __init__(
        self,
        layer_specs: dict[int, FullAttentionSpec],
        n_blocks: int,
        n_seq_max: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        rope_shift: RopeShift | None = None,
    ):
        if block_size <= 0 or n_seq_max <= 0:
            raise ValueError("block_size and n_seq_max must be positive")
        self.block_size = block_size
        self.n_seq_max = n_seq_max
        self.device = torch.device(device)
        self.specs = dict(layer_specs)
        self.pool = BlockPool(n_blocks)
        self.rope_shift = rope_shift
        n_cells = n_blocks * block_size
        self.k = {
            layer: torch.zeros(n_cells, s.n_kv_heads, s.head_dim, dtype=s.dtype, device=self.device)
            for layer, s in self.specs.items()
        }
        self.v = {layer: torch.zeros_like(t) for layer, t in self.k.items()}
        self.cell_pos = torch.full((n_cells,), _NO_POS, dtype=torch.long)  # bookkeeping, on CPU
        self.tables: list[list[int]] = [[] for _ in range(n_seq_max)]
        self.n: list[int] = [0] * n_seq_max

    # ---- helpers -------------------------------------------------------------------

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")

    def cells(self, seq: int, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Physical cell ids of ``seq``'s logical cells [start, end) -> [n] int64."""
        end = self.n[seq] if end is None else end
        if end <= start:
            return torch.empty(0, dtype=torch.long)
        bs = self.block_size
        table = torch.tensor(self.tables[seq][start // bs : _n_blocks_for(end, bs)], dtype=torch.long)
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
        need = _n_blocks_for(len(src), bs)
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

    # ---- protocol ------------------------------------------------------------------

    def prepare(self, batch: MemoryBatch) -> PagedKVView:
        if len(set(batch.seq_ids)) != len(batch.seq_ids):
            raise ValueError("a sequence appears twice in the batch")
        if batch.positions.numel() != batch.n_total:
            raise ValueError("positions do not match n_tokens")
        bs = self.block_size
        need = 0
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            n = self.n[seq]
            need += _n_blocks_for(n + n_new, bs) - len(self.tables[seq])
            if n_new and n % bs and self.pool.refcount[self.tables[seq][-1]] > 1:
                need += 1  # copy-on-write of the shared, partly filled last block
        if need > self.pool.n_free:
            raise CacheFull(f"batch needs {need} blocks, {self.pool.n_free} free")
        slots = []
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            n = self.n[seq]
            if n_new and n % bs and self.pool.refcount[self.tables[seq][-1]] > 1:
                self._rewrite_from(seq, n, torch.empty(0, dtype=torch.long))
            self.tables[seq] += self.pool.allocate(_n_blocks_for(n + n_new, bs) - len(self.tables[seq]))
            self.n[seq] = n + n_new
            slots.append(self.cells(seq, n))
        slot_mapping = torch.cat(slots) if slots else torch.empty(0, dtype=torch.long)  # [T]
        self.cell_pos[slot_mapping] = batch.positions.cpu()
        return PagedKVView(self, batch, slot_mapping)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        if seq < 0:
            for s in range(self.n_seq_max):
                self.seq_rm(s, p0, p1)
            return True
        self._check_seq(seq)
        pos = self._positions(seq)
        hi = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        if not bool(hi.any()):
            return True
        keep = ~hi
        first = int(hi.nonzero()[0])
        if not bool(keep[first:].any()):  # a suffix: truncate
            self.n[seq] = first
            self._release_blocks(seq, _n_blocks_for(first, self.block_size))
            return True
        tail = self.cells(seq, first)[keep[first:]]
        self._rewrite_from(seq, first, tail)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        pos = self._positions(src)
        sel = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        k = int(sel.sum())
        is_prefix = bool(sel[:k].all())
        need = 0 if is_prefix else _n_blocks_for(k, self.block_size)
        if need > self.pool.n_free + self._private_after_release(dst, 0):
            raise CacheFull(f"copying {k} cells needs {need} blocks")
        src_cells = self.cells(src)[sel]
        self._release_blocks(dst, 0)
        self.n[dst] = 0
        if is_prefix:
            shared = self.tables[src][: _n_blocks_for(k, self.block_size)]
            for b in shared:
                self.pool.share(b)
            self.tables[dst] = list(shared)
            self.n[dst] = k
        else:
            self._rewrite_from(dst, 0, src_cells)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq)
        for s in range(self.n_seq_max):
            if s != seq:
                self._release_blocks(s, 0)
                self.n[s] = 0

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        self._check_seq(seq)
        if delta == 0:
            return
        if not self.can_shift:
            raise NotImplementedError("this cache has no rope_shift hook")
        pos = self._positions(seq)
        sel = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        if not bool(sel.any()):
            return
        first = int(sel.nonzero()[0])
        bs = self.block_size
        shared = any(self.pool.refcount[b] > 1 for b in self.tables[seq][first // bs :])
        if shared:  # copy the affected blocks before writing them
            self._rewrite_from(seq, first, self.cells(seq, first))
        cells = self.cells(seq)[sel]
        deltas = torch.full((len(cells),), delta, dtype=torch.long)
        dev_cells = cells.to(self.device)
        for layer in self.specs:
            k = self.k[layer][dev_cells]
            self.k[layer][dev_cells] = self.rope_shift(layer, k, deltas.to(self.device))
        self.cell_pos[cells] += delta
        if delta < 0:
            self.seq_rm(seq, _NO_POS, 0)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self._positions(seq).min()) if self.n[seq] else -1

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self._positions(seq).max()) if self.n[seq] else -1

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return self.n[seq]

    def save_seq(self, seq: int) -> SeqState:
        self._check_seq(seq)
        cells = self.cells(seq)
        dev = cells.to(self.device)
        tensors: dict[str, torch.Tensor] = {}
        for layer in self.specs:
            tensors[f"k.{layer}"] = self.k[layer][dev].cpu()
            tensors[f"v.{layer}"] = self.v[layer][dev].cpu()
        meta = {"memory_kind": "kv", "layers": ",".join(str(x) for x in self.specs)}
        return SeqState(positions=self.cell_pos[cells].clone(), tensors=tensors, meta=meta)

    def _validate_state(self, state: SeqState) -> int:
        n = int(state.positions.numel())
        if state.positions.dim() != 1:
            raise StateMismatch("positions must be one-dimensional")
        for layer, spec in self.specs.items():
            for name in (f"k.{layer}", f"v.{layer}"):
                t = state.tensors.get(name)
                if t is None:
                    raise StateMismatch(f"state lacks tensor {name}")
                if tuple(t.shape) != (n, spec.n_kv_heads, spec.head_dim):
                    raise StateMismatch(
                        f"{name} has shape {tuple(t.shape)}, want {(n, spec.n_kv_heads, spec.head_dim)}"
                    )
        extra = set(state.tensors) - {f"{kv}.{layer}" for layer in self.specs for kv in "kv"}
        if extra:
            raise StateMismatch(f"state has unknown tensors {sorted(extra)[:4]}")
        return n

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        n = self._validate_state(state)
        need = _n_blocks_for(n, self.block_size)
        if need > self.pool.n_free + self._private_after_release(seq, 0):
            raise CacheFull(f"restoring {n} cells needs {need} blocks")
        self._release_blocks(seq, 0)
        self.tables[seq] = self.pool.allocate(need)
        self.n[seq] = n
        cells = self.cells(seq)
        dev = cells.to(self.device)
        for layer, spec in self.specs.items():
            self.k[layer][dev] = state.tensors[f"k.{layer}"].to(self.device, spec.dtype)
            self.v[layer][dev] = state.tensors[f"v.{layer}"].to(self.device, spec.dtype)
        self.cell_pos[cells] = state.positions.to(torch.long)

    @property
    def can_shift(self) -> bool:
        return self.rope_shift is not None

    def n_blocks_held(self, seqs: list[int]) -> int:
        return len(set().union(*(self.tables[s] for s in seqs)))  # set.union holds the GIL

    def usage(self) -> MemoryUsage:
        return MemoryUsage(
            kind=self.kind,
            n_blocks_total=self.pool.n_blocks,
            n_blocks_used=self.pool.n_used,
            block_size=self.block_size,
            n_cells_used=sum(self.n),
        )

    def integrity_check(self) -> None:
        refs: dict[int, int] = {}
        for seq, table in enumerate(self.tables):
            if len(table) != _n_blocks_for(self.n[seq], self.block_size):
                raise IntegrityError(f"sequence {seq}: {len(table)} blocks for {self.n[seq]} cells")
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        self.pool.check(refs)
