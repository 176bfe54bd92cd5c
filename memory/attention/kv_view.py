"""Per-batch views of the KV caches: store this step's K/V, then attend.

Sequences that decode one token and sequences that prefill a chunk are attended in
separate groups, so a decode row is never padded to a prefill chunk's length. Per
group, index tensors and the mask are built once per step (on first use) and shared by
every layer; attention cost grows with the longest sequence of the group, never with
the pool. Keys past a sequence's length, and padding, are masked out by position.

- ``PagedKVView`` (unified pool): each sequence's blocks are gathered whole
  (``index_select`` of contiguous [block_size, kv_heads, head_dim] rows) into a padded
  [B, n_blocks_max * block_size] buffer.
- ``StreamKVView`` (per-stream, in stream_kv.py): reads streams in place.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

from memory.attention.decode_tables import DecodeTables
from memory.attention.explicit_attention import explicit_attention
from memory.attention.kv_state import FAR
from memory.attention.paged_store import PagedStore
from memory.kv_codec import KVCodec
from memory.protocol import ForwardView, MemoryBatch
from memory.spec import LayerSpec

DecodeKernel = Callable[..., torch.Tensor]
"""(q [B, H, D], k, v [B, KVH, L, stored row] as the cache stores them (memory/kv_codec.py:
float32/float16/bfloat16 rows, or q8_0 as uint8), kv_pos [B, L], q_pos [B], window, scale, softcap)
-> [B, H, D] float32: one query row per sequence, seeing the keys at positions p with
p <= q_pos and, with a window W > 0, p > q_pos - W; softcap <= 0: none. The engine
installs its compiled one (engine/kernels); memory imports no engine code."""

_decode_kernel: DecodeKernel | None = None

StoreKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
"""(cache [R, stored row], rows [n], x [n, D] float32): x encoded as the cache stores rows
(kv_codec's encode, bit for bit) written at ``rows``, in one call. Installed by the engine."""

_store_kernel: StoreKernel | None = None


def set_decode_kernel(kernel: DecodeKernel | None) -> DecodeKernel | None:
    """Decode rows (one query per sequence, float32 on the CPU) attend through
    ``kernel`` instead of SDPA and a mask; None: SDPA. Returns the one it replaces."""
    global _decode_kernel
    previous, _decode_kernel = _decode_kernel, kernel
    return previous


StreamDecodeKernel = Callable[..., torch.Tensor]
"""(q [B, H, D], k, v [B, KVH, D], k_cache, v_cache [S, KVH, C, stored row], flat rows [B * KVH],
first stream, n_kv cells, kv_pos [B, n_kv], q_pos [B], window, scale, softcap, sinks [H] float32 or
None) -> [B, H, D]:
the store kernel and the decode kernel in one call, over streams first .. first + B - 1 of
per-stream caches (memory/attention/stream_kv.py's decode steps). Installed by the engine."""

_stream_decode_kernel: StreamDecodeKernel | None = None


def set_stream_decode_kernel(kernel: StreamDecodeKernel | None) -> StreamDecodeKernel | None:
    """Decode steps over a run of streams store and attend through ``kernel``; None: the
    store and decode kernels (or torch) one by one. Returns the one it replaces."""
    global _stream_decode_kernel
    previous, _stream_decode_kernel = _stream_decode_kernel, kernel
    return previous


def stream_decode_kernel() -> StreamDecodeKernel | None:
    return _stream_decode_kernel


def set_store_kernel(kernel: StoreKernel | None) -> StoreKernel | None:
    """Keys and values (float32, on the CPU) are stored through ``kernel`` instead of
    encode + ``index_copy_``; None: torch's. Returns the one it replaces."""
    global _store_kernel
    previous, _store_kernel = _store_kernel, kernel
    return previous


def store(cache: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, codec: KVCodec) -> None:
    """x [T, N, D] encoded by ``codec`` into the rows ``rows`` [T * N] of the flat
    ``cache`` [R, stored row]."""
    if _store_kernel is not None and x.dtype == torch.float32 and cache.device.type == "cpu":
        _store_kernel(cache, rows, x)
    else:
        cache.index_copy_(0, rows, codec.encode(x).reshape(-1, cache.shape[1]))


@dataclass
class AttentionLayout:
    """One group of sequences attended in one SDPA call."""

    tokens: torch.Tensor | None  # [T_g] rows of the step's flat batch in this group; None: all, in order
    keys: torch.Tensor | slice  # which stored keys: kind-specific (blocks, or streams)
    kv_pos: torch.Tensor  # [B_g, L] position of each key (CPU; FAR + 1 where none)
    q_pos: torch.Tensor  # [B_g, Q] position of each query (CPU; FAR for padding)
    q_rows: torch.Tensor | None  # [T_g] row of each token in the flattened [B_g * Q]; None when Q == 1
    device: torch.device
    q_vis: torch.Tensor | None = None  # [B_g, Q] the last position each query sees (None: q_pos)
    stepwise: bool = False  # verify steps (MemoryBatch.stepwise): each row as its position's decode step
    masks: dict = field(default_factory=dict)  # (window, dtype) -> [B_g, 1, Q, L] additive mask on the device

    @cached_property
    def decode_pos(self) -> torch.Tensor:
        """[B_g] the position of each sequence's one query (decode groups)."""
        return self.q_pos[:, 0]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B_g, Q, L)."""
        return self.q_pos.shape[0], self.q_pos.shape[1], self.kv_pos.shape[1]

    def mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask, 0 where a query may attend (causal by position, and with a
        window only keys in (q - window, q]) and -inf elsewhere. Built once per step,
        window and dtype, shared by the layers (a bool mask would be converted to this
        by SDPA in every layer)."""
        if (window, dtype) not in self.masks:
            last = self.q_pos if self.q_vis is None else self.q_vis
            allowed = self.kv_pos[:, None, :] <= last[:, :, None]  # [B_g, Q, L]
            if window is not None:
                allowed &= self.kv_pos[:, None, :] > self.q_pos[:, :, None] - window
            additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
            self.masks[(window, dtype)] = additive[:, None].to(self.device)  # [B_g, 1, Q, L]
        return self.masks[(window, dtype)]


class GroupedKVView(ForwardView):
    """The grouping, masks and SDPA; a subclass says where keys are and how to read them."""

    def __init__(
        self,
        batch: MemoryBatch,
        write_rows: torch.Tensor,
        device: torch.device,
        specs: dict[int, LayerSpec],
        windows: dict[int, int] | None = None,
    ):
        """``specs``: the stored layers' specs (their cache types); ``windows``: layer ->
        sliding window, for layers that attend through one."""
        self.batch = batch
        self.device = device
        self.write_rows_cpu = write_rows  # [T] rows of the flat [cells, KVH, D] storage
        self.codecs = {layer: (s.k_codec, s.v_codec) for layer, s in specs.items()}  # memory/kv_codec.py
        self.windows = windows or {}

    @cached_property
    def write_rows(self) -> torch.Tensor:
        """``write_rows`` on the device (copied on first use: a static decode step never uses it)."""
        return self.write_rows_cpu.to(self.device)

    @abstractmethod
    def _keys(self, seqs: list[int]) -> tuple[torch.Tensor | slice, torch.Tensor]:
        """(keys index, kv positions [B, L] on the CPU: FAR + 1 where no key is)."""

    def _store_and_attend(self, layer, q, k, v, scale, softcap, sinks=None) -> torch.Tensor | None:
        """Store and attend in one call where a kind can (q [T, H, D], k, v [T, KVH, D]);
        None: the general path (``_write``, then the groups)."""
        return None

    @abstractmethod
    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's keys and values (each [T, KVH, D]) where ``write_rows`` says."""

    @abstractmethod
    def _read(
        self, layer: int, keys: torch.Tensor | slice, n_seqs: int, n_kv: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a group -> two [B, KVH, L, D] tensors (views where possible)."""

    @cached_property
    def layouts(self) -> list[AttentionLayout]:
        """One layout per group; a group's sequences in seq-id order (so that the
        streams of consecutive slots are a run a stream view reads in place)."""
        n_tokens, seq_ids = self.batch.n_tokens, self.batch.seq_ids
        starts = list(itertools.accumulate(n_tokens, initial=0))[:-1]
        by_seq = sorted(range(len(n_tokens)), key=lambda i: seq_ids[i])
        decode = [i for i in by_seq if n_tokens[i] == 1]
        steps = [i for i in by_seq if n_tokens[i] != 1 and self.batch.steps(i)]
        chunks = [i for i in by_seq if n_tokens[i] != 1 and not self.batch.steps(i)]
        groups = [(g, g is steps) for g in (decode, steps, chunks) if g]
        if len(groups) == 1 and groups[0][0] == sorted(groups[0][0]):  # every row, in batch order
            return [self._layout(groups[0][0], None, starts, groups[0][1])]
        rows = [torch.cat([torch.arange(starts[i], starts[i] + n_tokens[i]) for i in g]) for g, _ in groups]
        return [self._layout(g, r.to(self.device), starts, st) for (g, st), r in zip(groups, rows)]

    def _layout(
        self, members: list[int], tokens: torch.Tensor | None, starts: list[int], stepwise: bool = False
    ) -> AttentionLayout:
        """``starts[i]``: first row of batch sequence ``i`` in the step's flat batch."""
        batch = self.batch
        n_new = [batch.n_tokens[i] for i in members]
        keys, kv_pos = self._keys([batch.seq_ids[i] for i in members])  # kv_pos: [B, L]
        n_seqs, n_q = len(members), max(n_new)
        q_pos = torch.full((n_seqs, n_q), FAR, dtype=torch.long)
        q_vis = q_pos.clone() if batch.visible is not None else None
        q_rows = []
        for j, i in enumerate(members):
            q_pos[j, : n_new[j]] = batch.positions[starts[i] : starts[i] + n_new[j]]
            if q_vis is not None:
                q_vis[j, : n_new[j]] = batch.visible[starts[i] : starts[i] + n_new[j]]
            q_rows.append(torch.arange(n_new[j]) + j * n_q)
        rows = torch.cat(q_rows).to(self.device) if n_q > 1 else None
        return AttentionLayout(tokens, keys, kv_pos, q_pos, rows, self.device, q_vis=q_vis, stepwise=stepwise)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if k is not None:  # None: a layer reading this layer's cache (stored earlier in the step)
            fused = self._store_and_attend(layer, q, k, v, scale, softcap, sinks)
            if fused is not None:
                return fused
            self._write(layer, k, v)
        layouts = self.layouts
        if len(layouts) == 1 and layouts[0].tokens is None:
            return self._attend_group(layer, layouts[0], q, scale, softcap, sinks)
        out = q.new_empty(q.shape)  # [T, H, D]
        for lay in layouts:
            part = self._attend_group(layer, lay, q.index_select(0, lay.tokens), scale, softcap, sinks)
            out.index_copy_(0, lay.tokens, part)
        return out

    def _attend_group(
        self,
        layer: int,
        lay: AttentionLayout,
        q: torch.Tensor,
        scale: float | None,
        softcap: float | None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [T_g, H, D] -> attention output [T_g, H, D] for one group."""
        n_seqs, n_q, n_kv = lay.shape
        n_tok, n_heads, head_dim = q.shape
        keys, values = self._read(layer, lay.keys, n_seqs, n_kv)  # [B, KVH, L, stored row]
        kernel = _decode_kernel
        if (
            kernel is not None
            and (n_q == 1 or (lay.stepwise and lay.q_vis is None))
            and q.device.type == "cpu"
            and q.dtype == torch.float32
        ):
            window = self.windows.get(layer) or 0
            scale = head_dim**-0.5 if scale is None else scale
            # the stored rows as they are: the kernel reads f32/f16/bf16 and q8_0 itself
            sunk = sinks.float().contiguous() if sinks is not None else None
            if n_q == 1:  # [B, H, D]
                pos = (lay.kv_pos, lay.decode_pos)
                return kernel(q, keys, values, *pos, window, scale, softcap or 0.0, False, None, sunk)
            # a verify step: each row against its sequence's keys up to its own position
            rows = lay.q_rows.cpu()  # [T_g] rows of the flat [B * Q]: each token's sequence and position
            q_pos = lay.q_pos.flatten()[rows]
            return kernel(q, keys, values, lay.kv_pos, q_pos, window, scale, softcap or 0.0, False, rows // n_q, sunk)
        if lay.q_rows is None:
            qp = q.reshape(n_seqs, 1, n_heads, head_dim)  # [B, 1, H, D]
        else:
            qp = q.new_zeros(n_seqs * n_q, n_heads, head_dim)
            qp[lay.q_rows] = q
            qp = qp.view(n_seqs, n_q, n_heads, head_dim)  # [B, Q, H, D]
        k_codec, v_codec = self.codecs[layer]
        keys, values = k_codec.decode(keys, q.dtype), v_codec.decode(values, q.dtype)  # [B, KVH, L, D]
        q4, k4, v4 = qp.transpose(1, 2), keys, values  # [B, H, Q, D], [B, KVH, L, D]
        mask = lay.mask(self.windows.get(layer), q.dtype)  # [B, 1, Q, L]
        if sinks is not None:
            out = explicit_attention(q4, k4, v4, mask, scale or head_dim**-0.5, softcap, sinks)  # [B, H, Q, D]
        elif softcap is None and n_q == 1:  # decode: a KV head's query heads are its G query rows
            n_kv_heads = k4.shape[1]
            qg = q4.reshape(n_seqs, n_kv_heads, n_heads // n_kv_heads, head_dim)  # [B, KVH, G, D]
            out = F.scaled_dot_product_attention(qg, k4, v4, attn_mask=mask, scale=scale)  # [B, KVH, G, D]
            out = out.reshape(n_seqs, n_heads, 1, head_dim)  # head h reads KV head h // G (CUDA float32 SDPA: strided)
        elif softcap is None:
            out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=True)
        else:
            out = explicit_attention(q4, k4, v4, mask, scale or head_dim**-0.5, softcap)  # [B, H, Q, D]
        out = out.transpose(1, 2).reshape(n_seqs * n_q, n_heads, head_dim)
        return out if lay.q_rows is None else out[lay.q_rows]  # [T_g, H, D]


class PagedKVView(GroupedKVView):
    def __init__(self, cache: PagedStore, batch: MemoryBatch, slot_mapping: torch.Tensor):
        super().__init__(batch, slot_mapping, cache.device, cache.specs, cache.windows)
        self.cache = cache
        self.slot_mapping = slot_mapping  # [T] physical cells (CPU)
        self._flat: dict[int, torch.Tensor] = {}  # KV heads -> [T * KVH] flat rows

    def decode_tables(self) -> DecodeTables:
        """The batch's rows' block tables (memory/attention/decode_tables.py); for a batch
        of one new token per sequence."""
        cache, bs, seqs = self.cache, self.cache.block_size, self.batch.seq_ids
        n_kv_heads = next(iter(cache.k.values())).shape[1]
        width = max(len(cache.tables[s]) for s in seqs)
        table = torch.zeros(len(seqs), width, dtype=torch.long)  # [B, n_blocks]
        for j, seq in enumerate(seqs):
            table[j, : len(cache.tables[seq])] = torch.tensor(cache.tables[seq], dtype=torch.long)
        lens = torch.tensor([cache.n[s] for s in seqs], dtype=torch.long)  # [B]
        write_rows = self.slot_mapping * n_kv_heads  # [B]: cell c, head 0
        return DecodeTables(table, lens, write_rows, bs, bs * n_kv_heads, 1, n_kv_heads)

    def _keys(self, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        cache, bs = self.cache, self.cache.block_size
        lengths = [cache.n[s] for s in seqs]
        n_blk = max(-(-n // bs) for n in lengths)
        blocks = torch.zeros(len(seqs), n_blk, dtype=torch.long)
        kv_pos = torch.full((len(seqs), n_blk * bs), FAR + 1, dtype=torch.long)
        for j, seq in enumerate(seqs):
            table = cache.tables[seq][: -(-lengths[j] // bs)]
            blocks[j, : len(table)] = torch.tensor(table, dtype=torch.long)
            kv_pos[j, : lengths[j]] = cache.cell_pos[cache.cells(seq)]
        return blocks.flatten().to(self.device), kv_pos

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]  # [cells, KVH, stored row]
        k_codec, v_codec = self.codecs[layer]
        rows = self._flat_rows(k_cache.shape[1])  # [T * KVH] rows of the flat [cells * KVH, stored row] cache
        store(k_cache.view(-1, k_cache.shape[2]), rows, k, k_codec)  # k, v: [T, KVH, D]
        store(v_cache.view(-1, v_cache.shape[2]), rows, v, v_codec)

    def _flat_rows(self, n_kv_heads: int) -> torch.Tensor:
        rows = self._flat.get(n_kv_heads)
        if rows is None:
            heads = torch.arange(n_kv_heads, device=self.device)
            rows = self._flat[n_kv_heads] = (self.write_rows[:, None] * n_kv_heads + heads).reshape(-1)
        return rows

    def _read(self, layer: int, keys: torch.Tensor, n_seqs: int, n_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
        bs = self.cache.block_size

        def gather(cache: torch.Tensor) -> torch.Tensor:  # [cells, KVH, W] -> [B, KVH, L, W] (W: stored row)
            by_block = cache.view(-1, bs, *cache.shape[1:])  # [blocks, bs, KVH, W]
            return by_block.index_select(0, keys).view(n_seqs, n_kv, *cache.shape[1:]).transpose(1, 2)

        return gather(self.cache.k[layer]), gather(self.cache.v[layer])
