"""From per-layer specs to one ``Memory``: the only place that decides which kind of
storage serves which layers (never from the architecture name).

Layers are grouped by their spec's ``kind``; the set of group kinds picks the memory
class from ``KINDS``. Adding a kind means: a spec class (memory/spec.py), a ``Memory``
class, and an entry here. Sizes come from the specs (``bytes_per_token``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memory.attention.paged_kv import PagedKVCache, RopeShift
from memory.attention.sliding_kv import SlidingKVCache
from memory.attention.stream_kv import StreamKVCache
from memory.composite.hybrid import HybridMemory
from memory.composite.iswa import ISWAMemory
from memory.composite.layer_reuse import LayerReuse
from memory.protocol import Memory
from memory.recurrent.recurrent_memory import RecurrentMemory
from memory.spec import NO_STORAGE, LayerSpec, ReuseSpec

LAYOUTS = ("unified", "stream")


@dataclass(frozen=True)
class MemoryConfig:
    """``n_ctx``: cells of the whole cache (llama-server's ``-c``), shared by
    ``n_seq_max`` sequences; ``block_size``: cells per block. ``layout``: ``unified``
    (one block pool; one sequence may use all of it) or ``stream`` (each sequence owns
    ``stream_cells`` contiguous cells); it applies to full-size caches. Sliding-window
    layers get a ring of window - 1 + ``max_step`` cells per sequence, unless
    ``swa_full``."""

    n_ctx: int
    n_seq_max: int
    block_size: int = 16
    device: torch.device | str = "cpu"
    layout: str = "unified"
    swa_full: bool = False  # sliding-window layers get a full-size cache (and can shift)
    max_step: int = 512  # most tokens one sequence adds in one step (sizes sliding-window rings)
    n_checkpoints: int = 2  # sliding-window checkpoints kept per sequence
    ssm_checkpoints: int = 4  # recurrent-state checkpoints kept per sequence
    ssm_checkpoint_every: int | None = 512  # ... taken every this many positions (and at each prompt's end)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got '{self.layout}'")

    @property
    def n_blocks(self) -> int:
        """Pool size: the whole context plus one partly filled block per sequence."""
        return -(-self.n_ctx // self.block_size) + self.n_seq_max

    @property
    def stream_cells(self) -> int:
        """Cells per stream: ``n_ctx / n_seq_max`` rounded up to whole blocks."""
        per_seq = -(-self.n_ctx // self.n_seq_max)
        return -(-per_seq // self.block_size) * self.block_size

    @property
    def seq_cells(self) -> int:
        """Most cells one sequence may hold."""
        return self.stream_cells if self.layout == "stream" else self.n_ctx


Builder = Callable[[dict[str, dict[int, LayerSpec]], MemoryConfig, RopeShift | None], Memory]


def _kv_of(specs: dict[int, LayerSpec], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    if cfg.layout == "stream":
        return StreamKVCache(specs, cfg.n_seq_max, cfg.stream_cells, cfg.device, rope_shift, cfg.block_size)
    return PagedKVCache(specs, cfg.n_blocks, cfg.n_seq_max, cfg.block_size, cfg.device, rope_shift)


def _kv(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    """Full-size caches for every layer (sliding layers too: their window is a mask)."""
    specs = {layer: spec for group in groups.values() for layer, spec in group.items()}
    return _kv_of(dict(sorted(specs.items())), cfg, rope_shift)


def _sliding(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    if cfg.swa_full:
        return _kv(groups, cfg, rope_shift)
    return _ring(groups["attention_sliding"], cfg)


def _ring(specs: dict[int, LayerSpec], cfg: MemoryConfig) -> SlidingKVCache:
    return SlidingKVCache(specs, cfg.n_seq_max, cfg.max_step, cfg.device, cfg.block_size, cfg.n_checkpoints)


def _iswa(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    if cfg.swa_full:
        return _kv(groups, cfg, rope_shift)
    full = _kv_of(groups["attention_full"], cfg, rope_shift)
    return ISWAMemory(full, _ring(groups["attention_sliding"], cfg))


def _recurrent(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    every = cfg.ssm_checkpoint_every
    return RecurrentMemory(groups["recurrent"], cfg.n_seq_max, cfg.device, cfg.ssm_checkpoints, every)


def _hybrid(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    """Attention layers in the memory their kinds alone would get; recurrent ones beside."""
    attn_groups = {kind: specs for kind, specs in groups.items() if kind != "recurrent"}
    attn = KINDS[frozenset(attn_groups)](attn_groups, cfg, rope_shift)
    return HybridMemory(attn, _recurrent(groups, cfg, rope_shift))


KINDS: dict[frozenset[str], Builder] = {
    frozenset({"attention_full"}): _kv,
    frozenset({"attention_sliding"}): _sliding,
    frozenset({"attention_full", "attention_sliding"}): _iswa,
    frozenset({"recurrent"}): _recurrent,
}
for _attn in list(KINDS):
    if "recurrent" not in _attn:
        KINDS[_attn | {"recurrent"}] = _hybrid


def group_layers(specs: Sequence[LayerSpec]) -> dict[str, dict[int, LayerSpec]]:
    """spec kind -> {layer: spec}, in layer order, for the layers that store something."""
    groups: dict[str, dict[int, LayerSpec]] = {}
    for layer, spec in enumerate(specs):
        if spec.kind not in NO_STORAGE:
            groups.setdefault(spec.kind, {})[layer] = spec
    return groups


def reuse_targets(specs: Sequence[LayerSpec]) -> dict[int, int]:
    """Reusing layer -> the layer whose cache it reads; ValueError unless the target is
    an earlier layer that stores its own cache."""
    targets = {}
    for layer, spec in enumerate(specs):
        if isinstance(spec, ReuseSpec):
            t = spec.target
            if not 0 <= t < layer or specs[t].kind in NO_STORAGE:
                raise ValueError(f"layer {layer} reuses layer {t}, which is not an earlier layer with its own cache")
            targets[layer] = t
    return targets


def build_memory(specs: Sequence[LayerSpec], cfg: MemoryConfig, rope_shift: RopeShift | None = None) -> Memory:
    """The memory for a model whose layer ``i`` needs ``specs[i]``. Raises ValueError
    naming the layer kinds when no memory kind serves that mix. Layers that reuse
    another's cache or have none get no storage."""
    targets = reuse_targets(specs)
    groups = group_layers(specs)
    builder = KINDS.get(frozenset(groups))
    if builder is None:
        raise ValueError(f"no memory kind serves layers of kinds {sorted(groups)}")
    memory = builder(groups, cfg, rope_shift)
    return LayerReuse(memory, targets) if targets else memory


def cache_bytes(specs: Sequence[LayerSpec], n_cells: int, n_seqs: int = 1) -> int:
    """Bytes that ``n_cells`` cells take in every layer that stores them, plus the
    fixed states of ``n_seqs`` sequences in recurrent layers (reusing and cache-less
    layers count 0)."""
    per_seq = sum(getattr(s, "bytes_per_seq", 0) for s in specs)
    return n_cells * sum(s.bytes_per_token for s in specs) + n_seqs * per_seq
