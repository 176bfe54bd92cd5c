"""Sliding-window KV cache: per sequence, a ring of cells that holds only what the
window can still see.

A layer with window W lets the query at position p see positions (p - W, p]. A step
adds at most ``max_step`` tokens per sequence, so a ring of ``R = W - 1 + max_step``
cells per sequence is enough: position q lives in cell ``q % R``, and the cells a step
overwrites hold positions no query of that step (or any later one) can see. Storage per
layer: [n_seq_max, R, kv_heads, head_dim], whatever the context length. Attention reads
a sequence's ring in place (``StreamKVView``); the window mask works by position, so the
order of cells in the ring does not matter.

Positions of a sequence are 0..n-1 (no shifting: ``can_shift`` is False); the ring holds
[lo, n). Cutting back to q (``seq_rm(seq, q)``) is exact while the ring still holds the
W - 1 positions before q, i.e. for the last ``max_step`` tokens or so; further back it
needs a *checkpoint*: ``checkpoint(seq)`` (called when a prompt has been computed) keeps
a copy of the last W - 1 cells, at most ``n_checkpoints`` per sequence (the first and the newest kept).
``seq_cut_point`` says where a cut is possible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memory.attention.kv_state import type_meta, validate_kv_state
from memory.attention.stream_kv import UNUSED, StreamKVView
from memory.kind_base import ForgettingKind
from memory.protocol import GroupUsage, IntegrityError, MemoryBatch, MemoryUsage, SeqState, StateMismatch
from memory.snapshot_shelf import SnapshotShelf
from memory.spec import LayerSpec, bytes_per_cell, window_of


@dataclass
class _Checkpoint:
    """The window before position ``end``: positions [m] and per layer k, v [m, KVH, D]."""

    end: int
    positions: torch.Tensor
    k: dict[int, torch.Tensor]
    v: dict[int, torch.Tensor]


class SlidingKVCache(ForgettingKind):
    kind = "kv_swa"
    copies = "a sliding-window cache"
    shift_refusal = "a sliding-window cache cannot shift positions (start with --swa-full)"

    def __init__(
        self,
        layer_specs: dict[int, LayerSpec],
        n_seq_max: int,
        max_step: int,
        device: torch.device | str = "cpu",
        block_size: int = 16,
        n_checkpoints: int = 2,
    ):
        """``max_step``: most tokens one sequence adds in one ``prepare``.
        ``block_size``: the unit in which ``usage`` counts cells. ``n_checkpoints``:
        windows kept per sequence for cuts further back than the ring (0: none)."""
        self.specs = dict(layer_specs)
        self.windows = {layer: window_of(s) for layer, s in self.specs.items()}
        if not self.specs or any(w is None or w <= 0 for w in self.windows.values()):
            raise ValueError("every layer of a sliding-window cache needs a positive window")
        self.window = max(self.windows.values())
        self.n_seq_max, self.max_step, self.block_size = n_seq_max, max_step, block_size
        self.n_checkpoints = n_checkpoints
        self.ring = self.window - 1 + max_step
        self.device = torch.device(device)
        store = lambda s, kv: torch.zeros(  # noqa: E731
            s.stored_shape(kv, n_seq_max, s.n_kv_heads, self.ring),
            dtype=s.codec_of(kv).storage,
            device=self.device,
        )
        self.k = {layer: store(s, "k") for layer, s in self.specs.items()}  # [S, KVH, R, stored row] (as streams)
        self.v = {layer: store(s, "v") for layer, s in self.specs.items()}
        self.cell_pos = torch.full((n_seq_max, self.ring), UNUSED, dtype=torch.long)  # [S, R]
        self.n = [0] * n_seq_max  # next position
        self.lo = [0] * n_seq_max  # lowest position held
        self.snaps: SnapshotShelf[_Checkpoint] = SnapshotShelf(n_seq_max, n_checkpoints)

    # ---- helpers -------------------------------------------------------------------

    def n_read(self, seq: int) -> int:
        """Leading ring cells in use (all of them once the ring has wrapped)."""
        return min(self.n[seq], self.ring)

    def _cells(self, seq: int, p0: int, p1: int) -> torch.Tensor:
        """Ring cells of positions [p0, p1), in position order -> [m] int64."""
        return torch.arange(p0, p1) % self.ring

    def _holds_window(self, seq: int, p: int) -> bool:
        """Whether the ring holds every position a query at ``p`` sees before ``p``."""
        return p <= self.n[seq] and max(0, p - self.window + 1) >= self.lo[seq]

    def _clear(self, seq: int) -> None:
        self.cell_pos[seq] = UNUSED
        self.n[seq] = self.lo[seq] = 0
        self.snaps.clear(seq)

    def _truncate(self, seq: int, p: int) -> None:
        """Drop positions >= p (the ring holds the window before p)."""
        self.cell_pos[seq][self.cell_pos[seq] >= p] = UNUSED
        self.n[seq] = p
        self.lo[seq] = min(self.lo[seq], p)
        self.snaps.cut(seq, p)

    def _write(self, seq: int, positions: torch.Tensor, k: dict, v: dict) -> None:
        """Put stored cells (positions [m], per layer [m, KVH, stored row]) into ``seq``'s ring."""
        cells = (positions % self.ring).to(self.device)
        for layer in self.specs:
            self.k[layer][seq].index_copy_(1, cells, k[layer].to(self.device).transpose(0, 1))
            self.v[layer][seq].index_copy_(1, cells, v[layer].to(self.device).transpose(0, 1))
        self.cell_pos[seq, positions % self.ring] = positions

    def _snapshot(self, seq: int, p0: int, p1: int) -> _Checkpoint:
        cells = self._cells(seq, p0, p1)
        dev = cells.to(self.device)
        k = {layer: t[seq].index_select(1, dev).transpose(0, 1).contiguous() for layer, t in self.k.items()}
        v = {layer: t[seq].index_select(1, dev).transpose(0, 1).contiguous() for layer, t in self.v.items()}
        # [m, KVH, D] copies
        return _Checkpoint(p1, torch.arange(p0, p1), k, v)

    def _can_cut(self, seq: int, q: int) -> bool:
        return q <= 0 or self._holds_window(seq, q) or self.snaps.at(seq, q) is not None

    def _snapshot_end(self, seq: int) -> _Checkpoint:
        end = self.n[seq]
        return self._snapshot(seq, max(self.lo[seq], end - self.window + 1), end)

    # ---- protocol ------------------------------------------------------------------

    def check_batch(self, batch: MemoryBatch) -> list[int]:
        """ValueError unless ``prepare(batch)`` can take it (no change): at most
        ``max_step`` tokens per sequence, each following its last position. Returns
        where each sequence's rows start in the batch (and the end)."""
        batch.check()
        positions = batch.positions.cpu()
        starts = [0]
        for seq, n_new in zip(batch.seq_ids, batch.n_tokens):
            self._check_seq(seq)
            if n_new > self.max_step:
                raise ValueError(f"{n_new} tokens in one step; this sliding-window cache takes {self.max_step}")
            mine = positions[starts[-1] : starts[-1] + n_new]
            if n_new and not torch.equal(mine, torch.arange(self.n[seq], self.n[seq] + n_new)):
                raise ValueError(f"sequence {seq}: new positions must follow its last one ({self.n[seq] - 1})")
            starts.append(starts[-1] + n_new)
        return starts

    def prepare(self, batch: MemoryBatch) -> StreamKVView:
        starts = self.check_batch(batch)
        positions = batch.positions.cpu()
        rows = []
        for i, (seq, n_new) in enumerate(zip(batch.seq_ids, batch.n_tokens)):
            new = positions[starts[i] : starts[i + 1]]
            rows.append(new % self.ring + seq * self.ring)
            self.cell_pos[seq, new % self.ring] = new
            self.n[seq] += n_new
            self.lo[seq] = max(self.lo[seq], self.n[seq] - self.ring)
        write_rows = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)  # [T] rows of [S * R]
        return StreamKVView(self, batch, write_rows)

    def seq_cut_point(self, seq: int, p: int) -> int:
        self._check_seq(seq)
        p = min(p, self.n[seq])
        if p <= 0 or self._holds_window(seq, p):
            return max(p, 0)
        return self.snaps.latest(seq, p)

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        """Whole sequences and suffixes only, and a suffix only back to a cut point
        (``seq_cut_point``); anything else returns False, unchanged."""
        if seq < 0:
            if any(not self.can_rm(s, p0, p1) for s in range(self.n_seq_max)):
                return False
            for s in range(self.n_seq_max):
                self.seq_rm(s, p0, p1)
            return True
        self._check_seq(seq)
        if not self.can_rm(seq, p0, p1):
            return False
        end = self.n[seq] if p1 is None else min(p1, self.n[seq])
        if end <= max(p0, 0):
            return True  # nothing in the range
        if p0 <= 0:
            self._clear(seq)
            return True
        ckpt = None if self._holds_window(seq, p0) else self.snaps.at(seq, p0)
        self._truncate(seq, p0)
        if ckpt is not None:
            self._write(seq, ckpt.positions, ckpt.k, ckpt.v)
            self.lo[seq] = int(ckpt.positions[0]) if len(ckpt.positions) else p0
        return True

    def can_rm(self, seq: int, p0: int, p1: int | None) -> bool:
        """Whether ``seq_rm(seq, p0, p1)`` would succeed (no change)."""
        n = self.n[seq]
        end = n if p1 is None else min(p1, n)
        if end <= max(p0, 0):
            return True
        if end < n:
            return False  # positions from the middle: the window would have a hole
        return p0 <= 0 or self._holds_window(seq, p0) or self.snaps.at(seq, p0) is not None

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        self.check_cp(src, dst, p0, p1)
        if src == dst:
            return
        q = self.n[src] if p1 is None else min(p1, self.n[src])
        ckpt = None if self._holds_window(src, q) else self.snaps.at(src, q)
        self._clear(dst)
        if q > 0:
            if ckpt is None:
                lo = max(self.lo[src], q - self.ring)
                ckpt = self._snapshot(src, lo, q)
            self._write(dst, ckpt.positions, ckpt.k, ckpt.v)
            self.n[dst] = q
            self.lo[dst] = int(ckpt.positions[0]) if len(ckpt.positions) else q
        self.snaps.copy(src, dst, q)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return self.lo[seq] if self.n[seq] else -1

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return self.n[seq] - self.lo[seq]

    def save_seq(self, seq: int) -> SeqState:
        """The cells the ring holds, in position order (at most the ring; the window
        before the end is enough to continue exactly)."""
        self._check_seq(seq)
        snap = self._snapshot(seq, self.lo[seq], self.n[seq])
        tensors = {f"k.{layer}": t.cpu() for layer, t in snap.k.items()}
        tensors.update({f"v.{layer}": t.cpu() for layer, t in snap.v.items()})
        meta = {"memory_kind": self.kind, "layers": ",".join(str(x) for x in self.specs), "window": str(self.window)}
        meta.update(type_meta(self.specs))
        return SeqState(positions=snap.positions, tensors=tensors, meta=meta)

    def validate_state(self, state: SeqState) -> tuple[int, int]:
        """(lo, end) of a state ``load_seq`` accepts; raises StateMismatch otherwise."""
        m = validate_kv_state(self.specs, state, self.kind, kinds=(self.kind,))
        pos = state.positions.to(torch.long)
        lo = int(pos[0]) if m else 0
        end = lo + m
        if m and not torch.equal(pos, torch.arange(lo, end)):
            raise StateMismatch("sliding-window positions must be consecutive")
        if m > self.ring:
            raise StateMismatch(f"the state holds {m} cells; this ring holds {self.ring}")
        if lo > max(0, end - self.window + 1):
            raise StateMismatch(f"the state holds {m} cells, less than the window of {self.window} needs")
        return lo, end

    def load_seq(self, seq: int, state: SeqState) -> None:
        self._check_seq(seq)
        lo, end = self.validate_state(state)
        self._clear(seq)
        k = {layer: state.tensors[f"k.{layer}"] for layer in self.specs}
        v = {layer: state.tensors[f"v.{layer}"] for layer in self.specs}
        self._write(seq, state.positions.to(torch.long), k, v)
        self.n[seq], self.lo[seq] = end, lo

    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        bs = self.block_size
        blocks = lambda seq: -(-self.seq_len(seq) // bs)  # noqa: E731
        group = GroupUsage(
            kind="attention_sliding",
            n_layers=len(self.specs),
            block_tokens=bs,
            n_blocks_total=self.n_seq_max * -(-self.ring // bs),
            n_blocks_used=sum(blocks(s) for s in range(self.n_seq_max)),
            n_blocks_held=sum(blocks(s) for s in set(held_by)),
            bytes_per_block=bs * bytes_per_cell(self.specs.values()),
        )
        return MemoryUsage(kind=self.kind, groups=(group,), n_cells_used=sum(self.n))

    def integrity_check(self) -> None:
        for seq in range(self.n_seq_max):
            lo, n = self.lo[seq], self.n[seq]
            if not 0 <= lo <= n or n - lo > self.ring:
                raise IntegrityError(f"sequence {seq}: holds [{lo}, {n}) in a ring of {self.ring}")
            used = self.cell_pos[seq] != UNUSED
            held = self.cell_pos[seq][used]
            if sorted(held.tolist()) != list(range(lo, n)):
                raise IntegrityError(f"sequence {seq}: ring positions are not [{lo}, {n})")
            if bool((held % self.ring != used.nonzero().flatten()).any()):
                raise IntegrityError(f"sequence {seq}: a position sits in the wrong ring cell")
            if problem := self.snaps.problem(seq, n):
                raise IntegrityError(f"sequence {seq}: {problem}")
