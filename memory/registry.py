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

from memory.paged_kv import PagedKVCache, RopeShift
from memory.protocol import Memory
from memory.spec import LayerSpec


@dataclass(frozen=True)
class MemoryConfig:
    """``n_ctx``: cells of the whole cache (llama-server's ``-c``), shared by
    ``n_seq_max`` sequences; ``block_size``: cells per block."""

    n_ctx: int
    n_seq_max: int
    block_size: int = 16
    device: torch.device | str = "cpu"

    @property
    def n_blocks(self) -> int:
        """Pool size: the whole context plus one partly filled block per sequence."""
        return -(-self.n_ctx // self.block_size) + self.n_seq_max


Builder = Callable[[dict[str, dict[int, LayerSpec]], MemoryConfig, RopeShift | None], Memory]


def _unified_kv(groups: dict[str, dict[int, LayerSpec]], cfg: MemoryConfig, rope_shift: RopeShift | None) -> Memory:
    return PagedKVCache(groups["attention_full"], cfg.n_blocks, cfg.n_seq_max, cfg.block_size, cfg.device, rope_shift)


KINDS: dict[frozenset[str], Builder] = {
    frozenset({"attention_full"}): _unified_kv,
}


def group_layers(specs: Sequence[LayerSpec]) -> dict[str, dict[int, LayerSpec]]:
    """spec kind -> {layer: spec}, in layer order."""
    groups: dict[str, dict[int, LayerSpec]] = {}
    for layer, spec in enumerate(specs):
        groups.setdefault(spec.kind, {})[layer] = spec
    return groups


def build_memory(specs: Sequence[LayerSpec], cfg: MemoryConfig, rope_shift: RopeShift | None = None) -> Memory:
    """The memory for a model whose layer ``i`` needs ``specs[i]``. Raises ValueError
    naming the layer kinds when no memory kind serves that mix."""
    groups = group_layers(specs)
    builder = KINDS.get(frozenset(groups))
    if builder is None:
        raise ValueError(f"no memory kind serves layers of kinds {sorted(groups)}")
    return builder(groups, cfg, rope_shift)


def cache_bytes(specs: Sequence[LayerSpec], n_cells: int) -> int:
    """Bytes that ``n_cells`` cells take in every layer that stores them."""
    return n_cells * sum(s.bytes_per_token for s in specs)
