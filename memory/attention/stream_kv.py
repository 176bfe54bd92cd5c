"""Per-stream KV cache: each sequence owns one contiguous stream of cells.

Storage per attention layer: K and V of shape [n_streams, kv_heads, stream_cells,
head_dim] (head-major, so a run of streams is an SDPA-ready [B, KVH, L, D] view);
sequence ``s`` lives in stream ``s``, its cells packed in order at ``[s, :, :n]``.
``cell_pos`` [n_streams, stream_cells] (on CPU) holds each cell's position; cells past
``n`` hold ``UNUSED``. Streams share nothing: ``seq_cp`` copies cells, and a sequence
can never hold more than ``stream_cells``. In exchange attention reads streams where
they lie (see ``StreamKVView``) instead of gathering blocks.

Keys are stored rotated; ``seq_add`` re-rotates them through the ``rope_shift`` hook.
"""

from __future__ import annotations

import torch

from memory.attention.decode_tables import DecodeTables
from memory.attention.kv_state import FAR, NO_POS, KVRopeShift, kv_state, shift_stored, type_meta, validate_kv_state
from memory.attention.kv_view import GroupedKVView, store, stream_decode_kernel
from memory.attention.lazy_zeros import lazy_zeros
from memory.kind_base import MemoryKind
from memory.protocol import (
    CacheFull,
    GroupUsage,
    IntegrityError,
    MemoryBatch,
    MemoryUsage,
    SeqState,
    StateMismatch,
)
from memory.spec import LayerSpec, bytes_per_cell, window_of

UNUSED = FAR + 1  # position of a cell past a stream's end: no query attends to it


class StreamKVCache(MemoryKind):
    kind = "kv_stream"
    shift_refusal = "this cache has no rope_shift hook"

    def __init__(
        self,
        layer_specs: dict[int, LayerSpec],
        n_seq_max: int,
        stream_cells: int,
        device: torch.device | str = "cpu",
        rope_shift: KVRopeShift | None = None,
        block_size: int = 16,
    ):
        """``block_size``: the unit in which ``usage`` counts cells (no paging here)."""
        if n_seq_max <= 0 or stream_cells <= 0 or block_size <= 0:
            raise ValueError("n_seq_max, stream_cells and block_size must be positive")
        self.n_seq_max, self.stream_cells, self.block_size = n_seq_max, stream_cells, block_size
        self.device = torch.device(device)
        self.specs = dict(layer_specs)
        self.windows = {layer: w for layer, s in self.specs.items() if (w := window_of(s)) is not None}
        self.rope_shift = rope_shift
        store = lambda s, kv: lazy_zeros(  # noqa: E731
            s.stored_shape(kv, n_seq_max, s.n_kv_heads, stream_cells),
            s.codec_of(kv).storage,
            self.device,
        )
        self.k = {layer: store(s, "k") for layer, s in self.specs.items()}
        self.v = {layer: store(s, "v") for layer, s in self.specs.items()}
        # [S, KVH, C, stored row] (memory/kv_codec.py); memory is committed as cells are first written
        self.cell_pos = torch.full((n_seq_max, stream_cells), UNUSED, dtype=torch.long)  # [S, C]
        self.n: list[int] = [0] * n_seq_max

    def n_read(self, seq: int) -> int:
        """Leading cells of ``seq``'s stream that attention reads."""
        return self.n[seq]

    def _select(self, seq: int, p0: int, p1: int | None) -> torch.Tensor:
        """[n] bool: ``seq``'s cells whose position is in [p0, p1)."""
        pos = self.cell_pos[seq, : self.n[seq]]
        return pos >= p0 if p1 is None else (pos >= p0) & (pos < p1)

    def _set_cells(self, dst: int, src: int, idx: torch.Tensor) -> None:
        """Stream ``dst`` becomes stream ``src``'s cells ``idx`` ([m] int64, in order)."""
        m = len(idx)
        dev_idx = idx.to(self.device)
        for layer in self.specs:
            k, v = self.k[layer][src].index_select(1, dev_idx), self.v[layer][src].index_select(1, dev_idx)  # copies
            self.k[layer][dst, :, :m] = k  # [KVH, m, D]
            self.v[layer][dst, :, :m] = v
        pos = self.cell_pos[src, idx]
        self.cell_pos[dst, m:] = UNUSED
        self.cell_pos[dst, :m] = pos
        self.n[dst] = m

    # ---- protocol ------------------------------------------------------------------

    def prepare(self, batch: MemoryBatch) -> StreamKVView:
        batch.check()
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            if self.n[seq] + n_new > self.stream_cells:
                raise CacheFull(
                    f"sequence {seq} needs {self.n[seq] + n_new} cells; its stream holds {self.stream_cells}"
                )
        positions = batch.positions.cpu()
        if all(n_new == 1 for n_new in batch.n_tokens):  # one token each (decode): in three tensor ops
            seqs = torch.tensor(batch.seq_ids, dtype=torch.long)
            cells = torch.tensor([self.n[s] for s in batch.seq_ids], dtype=torch.long)  # [B]
            self.cell_pos[seqs, cells] = positions
            for seq in batch.seq_ids:
                self.n[seq] += 1
            return StreamKVView(self, batch, seqs * self.stream_cells + cells)
        rows, start = [], 0
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            n = self.n[seq]
            rows.append(torch.arange(n, n + n_new) + seq * self.stream_cells)
            self.cell_pos[seq, n : n + n_new] = positions[start : start + n_new]
            self.n[seq] = n + n_new
            start += n_new
        write_rows = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)  # [T] rows of [S * C]
        return StreamKVView(self, batch, write_rows)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        if seq < 0:
            for s in range(self.n_seq_max):
                self.seq_rm(s, p0, p1)
            return True
        self._check_seq(seq)
        drop = self._select(seq, p0, p1)
        if not bool(drop.any()):
            return True
        first = int(drop.nonzero()[0])
        if bool(drop[first:].all()):  # a suffix: truncate
            self.cell_pos[seq, first:] = UNUSED
            self.n[seq] = first
            return True
        self._set_cells(seq, seq, (~drop).nonzero().flatten())
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        if src != dst:
            self._set_cells(dst, src, self._select(src, p0, p1).nonzero().flatten())

    def _clear(self, seq: int) -> None:
        self.cell_pos[seq] = UNUSED
        self.n[seq] = 0

    def _shift(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        idx = self._select(seq, p0, p1).nonzero().flatten()
        if not len(idx):
            return
        dev_idx = idx.to(self.device)
        deltas = torch.full((len(idx),), delta, dtype=torch.long, device=self.device)
        for layer in self.specs:
            k = self.k[layer][seq].index_select(1, dev_idx).transpose(0, 1)  # [m, KVH, stored row]
            shifted = shift_stored(self.specs[layer].k_codec, self.rope_shift, layer, k, deltas)
            self.k[layer][seq].index_copy_(1, dev_idx, shifted.transpose(0, 1))
        self.cell_pos[seq, idx] += delta
        if delta < 0:
            self.seq_rm(seq, NO_POS, 0)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self.cell_pos[seq, : self.n[seq]].min()) if self.n[seq] else -1

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self.cell_pos[seq, : self.n[seq]].max()) if self.n[seq] else -1

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return self.n[seq]

    def save_seq(self, seq: int) -> SeqState:
        self._check_seq(seq)
        n = self.n[seq]
        k = {layer: t[seq, :, :n].transpose(0, 1) for layer, t in self.k.items()}  # [n, KVH, D]
        v = {layer: t[seq, :, :n].transpose(0, 1) for layer, t in self.v.items()}
        return kv_state(self.kind, self.cell_pos[seq, :n], k, v, type_meta(self.specs))

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        n = validate_kv_state(self.specs, state, self.kind)
        if n > self.stream_cells:
            raise StateMismatch(f"the state holds {n} cells; a stream holds {self.stream_cells}")
        for layer in self.specs:
            self.k[layer][seq, :, :n] = state.tensors[f"k.{layer}"].to(self.device).transpose(0, 1)  # types checked
            self.v[layer][seq, :, :n] = state.tensors[f"v.{layer}"].to(self.device).transpose(0, 1)
        self.cell_pos[seq] = UNUSED
        self.cell_pos[seq, :n] = state.positions.to(torch.long)
        self.n[seq] = n

    @property
    def can_shift(self) -> bool:
        return self.rope_shift is not None

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        bs = self.block_size
        blocks = lambda seq: -(-self.n[seq] // bs)  # noqa: E731
        group = GroupUsage(
            kind="attention_full",
            n_layers=len(self.specs),
            block_tokens=bs,
            n_blocks_total=self.n_seq_max * (self.stream_cells // bs),
            n_blocks_used=sum(blocks(s) for s in range(self.n_seq_max)),
            n_blocks_held=sum(blocks(s) for s in set(held_by)),
            bytes_per_block=bs * bytes_per_cell(self.specs.values()),
        )
        return MemoryUsage(kind=self.kind, groups=(group,), n_cells_used=sum(self.n))

    def integrity_check(self) -> None:
        for seq, n in enumerate(self.n):
            if not 0 <= n <= self.stream_cells:
                raise IntegrityError(f"sequence {seq}: {n} cells in a stream of {self.stream_cells}")
            if bool((self.cell_pos[seq, :n] == UNUSED).any()) or bool((self.cell_pos[seq, n:] != UNUSED).any()):
                raise IntegrityError(f"sequence {seq}: cell positions disagree with its length {n}")


class StreamKVView(GroupedKVView):
    """When the group's sequences are a run of consecutive streams, attention reads them
    in place (a strided view, no copy); otherwise one ``index_select`` picks them.
    ``write_rows`` count cells across streams: row r is cell r % C of stream r // C."""

    def __init__(self, cache: StreamKVCache, batch: MemoryBatch, write_rows: torch.Tensor):
        super().__init__(batch, write_rows, cache.device, cache.specs, cache.windows)
        self.cache = cache
        self.n_cells = next(iter(cache.k.values())).shape[2] if cache.k else 1
        self._flat: dict[int, torch.Tensor] = {}  # KV heads -> [T * KVH] rows of the flat [S * KVH * C, D] cache

    def _store_and_attend(self, layer, q, k, v, scale, softcap, sinks=None) -> torch.Tensor | None:
        """A decode step over a run of streams stores and attends in one compiled call
        (``set_stream_decode_kernel``), where installed."""
        kernel, lays = stream_decode_kernel(), self.layouts
        lay = lays[0]
        if (
            kernel is None
            or len(lays) != 1
            or lay.tokens is not None
            or lay.q_rows is not None  # a prefill chunk
            or not isinstance(lay.keys, slice)
            or q.dtype != torch.float32
            or q.device.type != "cpu"
        ):
            return None
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]  # [S, KVH, C, stored row]
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        window = self.windows.get(layer) or 0
        rows = self._flat_rows(k_cache.shape[1])
        first, n_kv = lay.keys.start, lay.kv_pos.shape[1]
        pos = (lay.kv_pos, lay.decode_pos)
        sunk = sinks.float().contiguous() if sinks is not None else None  # [H]
        return kernel(q, k, v, k_cache, v_cache, rows, first, n_kv, *pos, window, scale, softcap or 0.0, sunk)

    def _flat_rows(self, n_kv_heads: int) -> torch.Tensor:
        """Row of each (token, KV head) in a layer's cache seen as [S * KVH * C, D]: one
        ``index_copy_`` stores a step's keys (advanced indexing with a slice between the
        indices costs ~2x as much per call on CPU)."""
        rows = self._flat.get(n_kv_heads)
        if rows is None:
            heads = torch.arange(n_kv_heads, device=self.device)
            seq, cell = self.write_rows // self.n_cells, self.write_rows % self.n_cells  # [T] each
            rows = ((seq[:, None] * n_kv_heads + heads) * self.n_cells + cell[:, None]).reshape(-1)
            self._flat[n_kv_heads] = rows
        return rows

    def decode_tables(self) -> DecodeTables:
        """The batch's rows as one-entry block tables (memory/attention/decode_tables.py);
        for a batch of one new token per sequence."""
        cache, seqs = self.cache, self.batch.seq_ids
        n_kv_heads, cells = next(iter(cache.k.values())).shape[1:3]
        lens = torch.tensor([cache.n[s] for s in seqs], dtype=torch.long)  # [B]
        table = torch.tensor(seqs, dtype=torch.long)[:, None]  # [B, 1]
        write_rows = table[:, 0] * n_kv_heads * cells + lens - 1  # [B]
        return DecodeTables(table, lens, write_rows, cells, n_kv_heads * cells, cells, 1)

    def _keys(self, seqs: list[int]) -> tuple[torch.Tensor | slice, torch.Tensor]:
        n_kv = max(self.cache.n_read(s) for s in seqs)
        first = seqs[0]
        if seqs == list(range(first, first + len(seqs))):  # a run of streams: read in place
            return slice(first, first + len(seqs)), self.cache.cell_pos[first : first + len(seqs), :n_kv]
        index = torch.tensor(seqs, dtype=torch.long)
        return index.to(self.device), self.cache.cell_pos[index, :n_kv]

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]  # [S, KVH, C, stored row]
        k_codec, v_codec = self.codecs[layer]
        rows = self._flat_rows(k_cache.shape[1])  # [T * KVH]
        store(k_cache.view(-1, k_cache.shape[3]), rows, k, k_codec)  # k, v: [T, KVH, D]
        store(v_cache.view(-1, v_cache.shape[3]), rows, v, v_codec)

    def _read(
        self, layer: int, keys: torch.Tensor | slice, n_seqs: int, n_kv: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.cache.k[layer][:, :, :n_kv], self.cache.v[layer][:, :, :n_kv]  # [S, KVH, L, D] views
        if isinstance(keys, slice):
            return k[keys], v[keys]
        return k.index_select(0, keys), v.index_select(0, keys)
