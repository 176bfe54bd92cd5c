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
from memory.kind_base import MemoryKind
from memory.protocol import (
    CacheFull,
    GroupUsage,
    IntegrityError,
    MemoryBatch,
    MemoryUsage,
    SeqState,
)
from memory.spec import LayerSpec

RopeShift = KVRopeShift


class PagedKVCache(MemoryKind):
    """The unified paged cache: the protocol's operations over a ``PagedStore`` it holds
    (blocks, tables, positions), which the per-step view reads too."""

    kind = "kv_unified"
    shift_refusal = "this cache has no rope_shift hook"

    def __init__(
        self,
        layer_specs: dict[int, LayerSpec],
        n_blocks: int,
        n_seq_max: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        rope_shift: RopeShift | None = None,
    ):
        self.store = PagedStore(layer_specs, n_blocks, n_seq_max, block_size, device)  # what the views read too
        self.specs, self.block_size, self.n_seq_max, self.device = (
            self.store.specs,
            block_size,
            n_seq_max,
            self.store.device,
        )
        self.rope_shift = rope_shift

    # ---- protocol ------------------------------------------------------------------

    def prepare(self, batch: MemoryBatch) -> PagedKVView:
        batch.check()
        bs = self.block_size
        need = 0
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            n = self.store.n[seq]
            need += n_blocks_for(n + n_new, bs) - len(self.store.tables[seq])
            if n_new and n % bs and self._frozen(self.store.tables[seq][-1]):
                need += 1  # copy-on-write of the shared or hashed, partly filled last block
        if need > self.store.pool.n_free:
            raise CacheFull(f"batch needs {need} blocks, {self.store.pool.n_free} free")
        slots = []
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            n = self.store.n[seq]
            if n_new and n % bs and self._frozen(self.store.tables[seq][-1]):
                self.store._rewrite_from(seq, n, torch.empty(0, dtype=torch.long))
            self.store.tables[seq] += self.store.pool.allocate(
                n_blocks_for(n + n_new, bs) - len(self.store.tables[seq])
            )
            self.store.n[seq] = n + n_new
            slots.append(self.store.cells(seq, n))
        slot_mapping = torch.cat(slots) if slots else torch.empty(0, dtype=torch.long)  # [T]
        self.store.cell_pos[slot_mapping] = batch.positions.cpu()
        return PagedKVView(self.store, batch, slot_mapping)

    def _frozen(self, block: int) -> bool:
        """Whether a write must copy ``block`` first: another sequence holds it, or its
        content is kept by hash (a kept block never changes)."""
        return self.store.pool.refcount[block] > 1 or block in self.store.pool.hash_of

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        if seq < 0:
            for s in range(self.n_seq_max):
                self.seq_rm(s, p0, p1)
            return True
        self._check_seq(seq)
        pos = self.store._positions(seq)
        hi = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        if not bool(hi.any()):
            return True
        keep = ~hi
        first = int(hi.nonzero()[0])
        if not bool(keep[first:].any()):  # a suffix: truncate
            self.store.n[seq] = first
            self.store._release_blocks(seq, n_blocks_for(first, self.block_size))
            return True
        tail = self.store.cells(seq, first)[keep[first:]]
        self.store._rewrite_from(seq, first, tail)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        pos = self.store._positions(src)
        sel = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        k = int(sel.sum())
        is_prefix = bool(sel[:k].all())
        need = 0 if is_prefix else n_blocks_for(k, self.block_size)
        if need > self.store.pool.n_free + self.store._private_after_release(dst, 0):
            raise CacheFull(f"copying {k} cells needs {need} blocks")
        src_cells = self.store.cells(src)[sel]
        self.store._release_blocks(dst, 0)
        self.store.n[dst] = 0
        if is_prefix:
            shared = self.store.tables[src][: n_blocks_for(k, self.block_size)]
            for b in shared:
                self.store.pool.share(b)
            self.store.tables[dst] = list(shared)
            self.store.n[dst] = k
        else:
            self.store._rewrite_from(dst, 0, src_cells)

    def publish_prefix(self, seq: int, tokens: list[int]) -> None:
        self._check_seq(seq)
        bs = self.block_size
        n = min(len(tokens), self.store.n[seq]) // bs * bs
        exact = self.store._positions(seq)[:n] == torch.arange(n)  # a shifted cell is not what its tokens computed
        n_blocks = int(exact.view(-1, bs).all(1).long().cumprod(0).sum()) if n else 0
        for block, h in zip(self.store.tables[seq][:n_blocks], block_hashes(tokens[: n_blocks * bs], bs)):
            self.store.pool.publish(block, h)

    def _kept_blocks(self, tokens: list[int]) -> list[int]:
        blocks = []
        for h in block_hashes(tokens, self.block_size):
            block = self.store.pool.lookup(h)
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
            self.store.pool.take(b)
        self.store._release_blocks(seq, 0)
        self.store.tables[seq] = blocks
        self.store.n[seq] = len(blocks) * self.block_size
        return self.store.n[seq]

    def _clear(self, seq: int) -> None:
        self.store._release_blocks(seq, 0)
        self.store.n[seq] = 0

    def _shift(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        pos = self.store._positions(seq)
        sel = pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)
        if not bool(sel.any()):
            return
        first = int(sel.nonzero()[0])
        bs = self.block_size
        if any(self._frozen(b) for b in self.store.tables[seq][first // bs :]):  # copy them before writing
            self.store._rewrite_from(seq, first, self.store.cells(seq, first))
        cells = self.store.cells(seq)[sel]
        deltas = torch.full((len(cells),), delta, dtype=torch.long)
        dev_cells = cells.to(self.device)
        for layer in self.specs:
            k = self.store.k[layer][dev_cells]  # [m, KVH, stored row]
            codec = self.specs[layer].k_codec
            self.store.k[layer][dev_cells] = shift_stored(codec, self.rope_shift, layer, k, deltas.to(self.device))
        self.store.cell_pos[cells] += delta
        if delta < 0:
            self.seq_rm(seq, NO_POS, 0)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self.store._positions(seq).min()) if self.store.n[seq] else -1

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self.store._positions(seq).max()) if self.store.n[seq] else -1

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return self.store.n[seq]

    def save_seq(self, seq: int) -> SeqState:
        self._check_seq(seq)
        cells = self.store.cells(seq)
        dev = cells.to(self.device)
        k = {layer: self.store.k[layer][dev] for layer in self.specs}
        v = {layer: self.store.v[layer][dev] for layer in self.specs}
        return kv_state(self.kind, self.store.cell_pos[cells], k, v, type_meta(self.specs))

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        n = validate_kv_state(self.specs, state, self.kind)
        need = n_blocks_for(n, self.block_size)
        if need > self.store.pool.n_free + self.store._private_after_release(seq, 0):
            raise CacheFull(f"restoring {n} cells needs {need} blocks")
        self.store._release_blocks(seq, 0)
        self.store.tables[seq] = self.store.pool.allocate(need)
        self.store.n[seq] = n
        cells = self.store.cells(seq)
        dev = cells.to(self.device)
        for layer in self.specs:
            self.store.k[layer][dev] = state.tensors[f"k.{layer}"].to(self.device)  # types checked above
            self.store.v[layer][dev] = state.tensors[f"v.{layer}"].to(self.device)
        self.store.cell_pos[cells] = state.positions.to(torch.long)

    @property
    def can_shift(self) -> bool:
        return self.rope_shift is not None

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        held_set = set().union(*(self.store.tables[s] for s in held_by))  # set.union holds the GIL
        refcount = self.store.pool.refcount
        held, shared = len(held_set), sum(1 for b in held_set if refcount[b] > 1)
        group = GroupUsage(
            kind="attention_full",
            n_layers=len(self.specs),
            block_tokens=self.block_size,
            n_blocks_total=self.store.pool.n_blocks,
            n_blocks_used=self.store.pool.n_used,
            n_blocks_held=held,
            bytes_per_block=self.store.bytes_per_block,
            n_blocks_shared=shared,
            n_blocks_cached=self.store.pool.n_cached,
        )
        return MemoryUsage(kind=self.kind, groups=(group,), n_cells_used=sum(self.store.n))

    def integrity_check(self) -> None:
        refs: dict[int, int] = {}
        for seq, table in enumerate(self.store.tables):
            if len(table) != n_blocks_for(self.store.n[seq], self.block_size):
                raise IntegrityError(f"sequence {seq}: {len(table)} blocks for {self.store.n[seq]} cells")
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        self.store.pool.check(refs)
