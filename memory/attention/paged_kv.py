"""Unified KV cache on paged storage (``paged_store``): one block pool shared by every
sequence. Blocks are reference-counted: a prefix ``seq_cp`` shares blocks, and any
write into a block whose count is above one copies it first (copy-on-write). Each
physical cell carries its position in ``cell_pos``; shared cells always agree on it
because shifting a shared block copies it first.

Keys are stored rotated; ``seq_add`` re-rotates them through the ``rope_shift`` hook
given by the engine (memory imports no model code).

Whole blocks of a finished prompt are kept by the hash of their tokens
(``publish_prefix``, memory/attention/block_pool.py): a kept block is never written (a write
copies it, as a shared one), and a later prompt takes it (``attach_prefix``).
"""

from __future__ import annotations

import torch

from memory.attention.kv_state import NO_POS, KVRopeShift, kv_state, shift_stored, type_meta, validate_kv_state
from memory.attention.kv_view import PagedKVView
from memory.attention.paged_store import PagedStore, n_blocks_for
from memory.attention.prefix_hash import block_hashes
from memory.protocol import (
    CacheFull,
    GroupUsage,
    IntegrityError,
    Memory,
    MemoryBatch,
    MemoryUsage,
    SeqState,
)
from memory.spec import LayerSpec

RopeShift = KVRopeShift


class PagedKVCache(PagedStore, Memory):
    kind = "kv_unified"

    def __init__(
        self,
        layer_specs: dict[int, LayerSpec],
        n_blocks: int,
        n_seq_max: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        rope_shift: RopeShift | None = None,
    ):
        super().__init__(layer_specs, n_blocks, n_seq_max, block_size, device)
        self.rope_shift = rope_shift

    # ---- protocol ------------------------------------------------------------------

    def prepare(self, batch: MemoryBatch) -> PagedKVView:
        batch.check()
        bs = self.block_size
        need = 0
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            n = self.n[seq]
            need += n_blocks_for(n + n_new, bs) - len(self.tables[seq])
            if n_new and n % bs and self._frozen(self.tables[seq][-1]):
                need += 1  # copy-on-write of the shared or hashed, partly filled last block
        if need > self.pool.n_free:
            raise CacheFull(f"batch needs {need} blocks, {self.pool.n_free} free")
        slots = []
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            n = self.n[seq]
            if n_new and n % bs and self._frozen(self.tables[seq][-1]):
                self._rewrite_from(seq, n, torch.empty(0, dtype=torch.long))
            self.tables[seq] += self.pool.allocate(n_blocks_for(n + n_new, bs) - len(self.tables[seq]))
            self.n[seq] = n + n_new
            slots.append(self.cells(seq, n))
        slot_mapping = torch.cat(slots) if slots else torch.empty(0, dtype=torch.long)  # [T]
        self.cell_pos[slot_mapping] = batch.positions.cpu()
        return PagedKVView(self, batch, slot_mapping)

    def _frozen(self, block: int) -> bool:
        """Whether a write must copy ``block`` first: another sequence holds it, or its
        content is kept by hash (a kept block never changes)."""
        return self.pool.refcount[block] > 1 or block in self.pool.hash_of

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
            self._release_blocks(seq, n_blocks_for(first, self.block_size))
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
        need = 0 if is_prefix else n_blocks_for(k, self.block_size)
        if need > self.pool.n_free + self._private_after_release(dst, 0):
            raise CacheFull(f"copying {k} cells needs {need} blocks")
        src_cells = self.cells(src)[sel]
        self._release_blocks(dst, 0)
        self.n[dst] = 0
        if is_prefix:
            shared = self.tables[src][: n_blocks_for(k, self.block_size)]
            for b in shared:
                self.pool.share(b)
            self.tables[dst] = list(shared)
            self.n[dst] = k
        else:
            self._rewrite_from(dst, 0, src_cells)

    def publish_prefix(self, seq: int, tokens: list[int]) -> None:
        self._check_seq(seq)
        bs = self.block_size
        n = min(len(tokens), self.n[seq]) // bs * bs
        exact = self._positions(seq)[:n] == torch.arange(n)  # a shifted cell is not what its tokens computed
        n_blocks = int(exact.view(-1, bs).all(1).long().cumprod(0).sum()) if n else 0
        for block, h in zip(self.tables[seq][:n_blocks], block_hashes(tokens[: n_blocks * bs], bs)):
            self.pool.publish(block, h)

    def _kept_blocks(self, tokens: list[int]) -> list[int]:
        blocks = []
        for h in block_hashes(tokens, self.block_size):
            block = self.pool.lookup(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cached_prefix(self, tokens: list[int]) -> int:
        return len(self._kept_blocks(tokens)) * self.block_size

    def attach_prefix(self, seq: int, tokens: list[int]) -> int:
        self._check_seq(seq)
        blocks = self._kept_blocks(tokens)
        if not blocks:
            return 0
        for b in blocks:  # taken before the sequence lets go of its own (which may be the same)
            self.pool.take(b)
        self._release_blocks(seq, 0)
        self.tables[seq] = blocks
        self.n[seq] = len(blocks) * self.block_size
        return self.n[seq]

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
        if any(self._frozen(b) for b in self.tables[seq][first // bs :]):  # copy them before writing
            self._rewrite_from(seq, first, self.cells(seq, first))
        cells = self.cells(seq)[sel]
        deltas = torch.full((len(cells),), delta, dtype=torch.long)
        dev_cells = cells.to(self.device)
        for layer in self.specs:
            k = self.k[layer][dev_cells]  # [m, KVH, stored row]
            codec = self.specs[layer].k_codec
            self.k[layer][dev_cells] = shift_stored(codec, self.rope_shift, layer, k, deltas.to(self.device))
        self.cell_pos[cells] += delta
        if delta < 0:
            self.seq_rm(seq, NO_POS, 0)

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
        k = {layer: self.k[layer][dev] for layer in self.specs}
        v = {layer: self.v[layer][dev] for layer in self.specs}
        return kv_state(self.kind, self.cell_pos[cells], k, v, type_meta(self.specs))

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        n = validate_kv_state(self.specs, state, self.kind)
        need = n_blocks_for(n, self.block_size)
        if need > self.pool.n_free + self._private_after_release(seq, 0):
            raise CacheFull(f"restoring {n} cells needs {need} blocks")
        self._release_blocks(seq, 0)
        self.tables[seq] = self.pool.allocate(need)
        self.n[seq] = n
        cells = self.cells(seq)
        dev = cells.to(self.device)
        for layer in self.specs:
            self.k[layer][dev] = state.tensors[f"k.{layer}"].to(self.device)  # types checked above
            self.v[layer][dev] = state.tensors[f"v.{layer}"].to(self.device)
        self.cell_pos[cells] = state.positions.to(torch.long)

    @property
    def can_shift(self) -> bool:
        return self.rope_shift is not None

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        held_set = set().union(*(self.tables[s] for s in held_by))  # set.union holds the GIL
        refcount = self.pool.refcount
        held, shared = len(held_set), sum(1 for b in held_set if refcount[b] > 1)
        group = GroupUsage(
            kind="attention_full",
            n_layers=len(self.specs),
            block_tokens=self.block_size,
            n_blocks_total=self.pool.n_blocks,
            n_blocks_used=self.pool.n_used,
            n_blocks_held=held,
            bytes_per_block=self.bytes_per_block,
            n_blocks_shared=shared,
            n_blocks_cached=self.pool.n_cached,
        )
        return MemoryUsage(kind=self.kind, groups=(group,), n_cells_used=sum(self.n))

    def integrity_check(self) -> None:
        refs: dict[int, int] = {}
        for seq, table in enumerate(self.tables):
            if len(table) != n_blocks_for(self.n[seq], self.block_size):
                raise IntegrityError(f"sequence {seq}: {len(table)} blocks for {self.n[seq]} cells")
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        self.pool.check(refs)
