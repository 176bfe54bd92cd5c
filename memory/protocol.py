"""The memory protocol every cache kind implements (after llama.cpp's llama_memory_i).

A *sequence* is identified by an int in [0, n_seq_max); the server maps one slot to one
sequence. A sequence holds a set of *positions* (token positions whose cache entries
are stored). Call order per engine step: ``prepare(batch)`` reserves room for the new
tokens and returns a per-batch view; the model forward then writes and reads the cache
only through that view. All other operations run between steps.

Every mutating operation is all-or-nothing: when it raises, the state is unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


class MemoryError_(Exception):
    """Base class of memory errors (named with a trailing underscore to not shadow
    the builtin ``MemoryError``)."""


class CacheFull(MemoryError_):
    """Not enough free storage for the operation; nothing was changed."""


class IntegrityError(MemoryError_):
    """An internal bookkeeping invariant does not hold (a bug, never user input)."""


class StateMismatch(MemoryError_):
    """An imported sequence state does not fit this memory (shapes, kind, layers)."""


@dataclass(frozen=True)
class MemoryBatch:
    """The new tokens of one forward step, grouped by sequence.

    ``seq_ids[i]`` contributes ``n_tokens[i]`` consecutive rows of the flat batch;
    ``positions`` ([T], int64) holds each row's position. A sequence appears once.
    ``visible``: where a row sees past its own position, the last position it sees (the
    tokens of one image attend to each other both ways: Gemma 3); a sliding window still
    counts back from the row's own position.
    ``stepwise[i]``: sequence i's rows continue its decoding (a speculation's verify
    step), so each row is computed bit for bit as the decode step of its position would
    be: attention through the decode path, a recurrent mixer a token at a time. The last
    float bits then agree too, which 8-bit activations would otherwise turn into another
    token now and then. None: no such sequence.
    """

    seq_ids: list[int]
    n_tokens: list[int]
    positions: torch.Tensor  # [T] int64
    visible: torch.Tensor | None = None  # [T] int64: the last position each row sees (None: its own)
    stepwise: list[bool] | None = None

    @property
    def n_total(self) -> int:
        return int(sum(self.n_tokens))

    def check(self) -> None:
        """ValueError on a malformed batch (a sequence twice, positions of the wrong count)."""
        if len(set(self.seq_ids)) != len(self.seq_ids):
            raise ValueError("a sequence appears twice in the batch")
        if self.positions.numel() != self.n_total:
            raise ValueError("positions do not match n_tokens")
        if self.visible is not None and self.visible.shape != self.positions.shape:
            raise ValueError("visible does not match positions")
        if self.stepwise is not None and len(self.stepwise) != len(self.seq_ids):
            raise ValueError("stepwise does not match seq_ids")

    def steps(self, i: int) -> bool:
        """Whether batch sequence i's rows are computed as decode steps (``stepwise``)."""
        return self.stepwise is not None and self.stepwise[i]


@dataclass(frozen=True)
class GroupUsage:
    """Storage of one group of layers that share a layout (e.g. the full-attention
    layers of a model). A *block* is the group's unit of allocation: ``block_tokens``
    cells of every layer of the group, or one sequence's whole state when
    ``block_tokens`` is 0 (recurrent kinds). Byte figures count real storage only."""

    kind: str  # "attention_full" | "attention_sliding" | "recurrent"
    n_layers: int
    block_tokens: int
    n_blocks_total: int
    n_blocks_used: int  # blocks referenced by any sequence, idle caches included
    n_blocks_held: int  # distinct blocks referenced by the sequences asked about (``usage(held_by)``)
    bytes_per_block: int
    n_blocks_shared: int = 0  # of those, blocks that more than one sequence references
    n_blocks_cached: int = 0  # blocks no sequence references, kept by their tokens' hash (reusable, evictable)

    @property
    def bytes_total(self) -> int:
        return self.n_blocks_total * self.bytes_per_block

    @property
    def bytes_used(self) -> int:
        return self.n_blocks_used * self.bytes_per_block


@dataclass(frozen=True)
class MemoryUsage:
    """Statistics every kind reports: its name, one entry per layer group, and the
    logical cells held summed over sequences (a shared cell counts once per sequence)."""

    kind: str
    groups: tuple[GroupUsage, ...]
    n_cells_used: int

    @property
    def bytes_total(self) -> int:
        return sum(g.bytes_total for g in self.groups)

    @property
    def bytes_used(self) -> int:
        return sum(g.bytes_used for g in self.groups)

    @property
    def ratio(self) -> float:
        """Share of the storage bytes in use (0-1)."""
        return self.bytes_used / self.bytes_total if self.bytes_total else 0.0


@dataclass
class SeqState:
    """One sequence's cache as plain tensors, independent of block layout.

    ``positions``: [n] int64, in cell order. ``tensors``: name -> tensor whose first
    dimension is n (e.g. ``k.3`` = layer 3 keys, [n, kv_heads, head_dim]).
    ``meta``: string metadata (memory kind, layer count...).
    """

    positions: torch.Tensor
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)


class ForwardView(ABC):
    """What a model sees of memory during one forward pass."""

    @abstractmethod
    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store this batch's ``k``/``v`` of ``layer``, then attend.

        q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] (keys already rotated), or
        None to attend to what ``layer`` stored earlier in this step without storing.
        Returns [T, heads, head_dim]. Each row attends to its own sequence's cells whose
        position is <= the row's position (causal by position), and for a layer with a
        sliding window only to those within it. ``scale``: score scale (default
        1/sqrt(head_dim)); ``softcap``: scores become ``tanh(s / cap) * cap`` (Gemma 2);
        ``sinks`` [heads] float32: a logit per query head in every row's softmax that takes
        weight but has no value (gpt-oss's attention sinks).
        """

    def states(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A recurrent ``layer``'s states of the batch's sequences, in batch order (copies):
        conv [B, *conv_shape], ssm [B, *ssm_shape]; zeros for a sequence at position 0."""
        raise NotImplementedError("this memory has no recurrent layers")

    def store(self, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Write back a recurrent ``layer``'s states after the batch's tokens (as ``states``)."""
        raise NotImplementedError("this memory has no recurrent layers")


class Memory(ABC):
    """Contract shared by all cache kinds. See the module docstring for call order."""

    kind: str = "abstract"
    n_seq_max: int  # sequences are 0 .. n_seq_max - 1
    checkpoint_every: int | None = None  # kinds that snapshot every this many positions (the planner aligns)

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")

    @abstractmethod
    def prepare(self, batch: MemoryBatch) -> ForwardView:
        """Reserve cells for ``batch``'s new tokens and return the view for the forward.

        Mutates: the sequences of the batch gain the batch's positions (their cells hold
        garbage until the forward writes them; if the forward fails, the caller must
        ``seq_rm`` those positions). Raises ``CacheFull`` (state unchanged) when storage
        is short, ``ValueError`` on a malformed batch.
        """

    @abstractmethod
    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> bool:
        """Drop ``seq``'s positions in [p0, p1) (``p1=None``: to the end; ``seq=-1``:
        every sequence). Returns False, unchanged, if this kind cannot do it."""

    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Replace ``dst``'s contents with ``src``'s positions in [p0, p1).

        A prefix is shared, not copied, where the kind allows. Raises ``CacheFull``
        (unchanged) if a copy is needed and storage is short.
        """

    def seq_cut_point(self, seq: int, p: int) -> int:
        """The largest position q <= p such that ``seq_rm(seq, q)`` and
        ``seq_cp(seq, dst, 0, q)`` succeed and leave everything a query at position q
        needs (kinds that keep only a window, or a recurrent state, can cut only where
        they still hold or kept a checkpoint). Default: any position."""
        return p

    def checkpoint(self, seq: int, pin: bool = False) -> None:
        """Keep what a later cut back to ``seq``'s end needs (kinds that forget, e.g.
        sliding windows and recurrent states). ``pin``: the end of a prompt, which stays
        beyond the bound on checkpoints while it is the oldest such (the conversation's
        first prompt: other conversations with the same start restart from it).
        Default: nothing."""
        return None

    def hold(self, seq: int) -> None:
        """Keep a transient point to cut ``seq`` back to, at its end, beside its
        checkpoints (replacing any held before; never listed, saved or copied): what a
        speculative step needs to undo a rejected proposal (``seq_rm`` back to it).
        Default: nothing (kinds that cut anywhere)."""
        return None

    @property
    def cuts_anywhere(self) -> bool:
        """Whether a sequence (or a state restored into one) can be cut at every
        position it holds (``seq_cut_point(seq, p) == p``): what a restore from the
        prompt cache needs to know before it restores. Default: yes."""
        return True

    def checkpoints(self, seq: int) -> list[int]:
        """Positions ``seq`` keeps a checkpoint for (oldest first); [] for kinds that
        need none to cut anywhere."""
        return []

    # ---- blocks kept by the hash of their tokens (kinds with a shared pool) ----------

    def publish_prefix(self, seq: int, tokens: list[int]) -> None:
        """``seq`` holds the cache of ``tokens`` from position 0: its whole blocks become
        findable by their tokens' hashes, and stay in the pool (unreferenced) after the
        sequence lets go of them, until storage is needed. Default: nothing."""
        return None

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of ``tokens`` kept blocks hold (a multiple of the
        block size). Default: 0."""
        return 0

    def attach_prefix(self, seq: int, tokens: list[int]) -> int:
        """Replace ``seq``'s contents with the kept blocks of ``tokens``' longest cached
        prefix (shared, not copied); returns the tokens it holds then (0: ``seq``
        unchanged)."""
        return 0

    @abstractmethod
    def seq_keep(self, seq: int) -> None:
        """Drop every sequence but ``seq``."""

    @abstractmethod
    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        """Shift ``seq``'s positions in [p0, p1) by ``delta`` (context shift).

        Keys are re-rotated so attention sees them at their new position. Positions
        that become negative are dropped. Raises ``NotImplementedError`` when
        ``can_shift`` is False, ``CacheFull`` (unchanged) if shared storage must be
        copied first and none is free.
        """

    @abstractmethod
    def seq_pos_min(self, seq: int) -> int:
        """Smallest position held by ``seq``, -1 if empty."""

    @abstractmethod
    def seq_pos_max(self, seq: int) -> int:
        """Largest position held by ``seq``, -1 if empty."""

    @abstractmethod
    def seq_len(self, seq: int) -> int:
        """Number of cells ``seq`` holds."""

    @abstractmethod
    def save_seq(self, seq: int) -> SeqState:
        """Export ``seq``'s cache as layout-independent tensors (no mutation)."""

    @abstractmethod
    def load_seq(self, seq: int, state: SeqState) -> None:
        """Replace ``seq``'s contents with ``state``. Validates everything first:
        raises ``StateMismatch`` or ``CacheFull`` with the state unchanged."""

    @property
    @abstractmethod
    def can_shift(self) -> bool:
        """Whether ``seq_add`` is supported."""

    @abstractmethod
    def usage(self, held_by: list[int] | tuple[int, ...] = ()) -> MemoryUsage:
        """Storage statistics; each group's ``n_blocks_held`` counts the distinct blocks
        that the sequences ``held_by`` reference (a shared block counts once). May be
        called from another thread: a racy but safe read, for monitoring."""

    @abstractmethod
    def integrity_check(self) -> None:
        """Raise ``IntegrityError`` if bookkeeping is inconsistent."""
