"""Layer specs that own no cache: a layer that reuses another layer's keys and values
(Gemma 3n's KV sharing) and a layer with no attention cache at all (a layer filter)."""

from __future__ import annotations

import pytest
import torch

from memory import FullAttentionSpec, MemoryBatch, MemoryConfig, SlidingWindowSpec, build_memory
from memory.spec import NoCacheSpec, ReuseSpec

F32 = torch.float32
FULL = FullAttentionSpec(2, 8, F32)
WINDOW = SlidingWindowSpec(2, 8, F32, 4)


def batch() -> MemoryBatch:
    return MemoryBatch([0, 1], [5, 1], torch.tensor([0, 1, 2, 3, 4, 0]))


def qkv(seed: int, n: int = 6) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, h, 8, generator=g) for h in (4, 2, 2))


@pytest.mark.parametrize("layout", ["unified", "stream"])
@pytest.mark.parametrize("owner", [FULL, WINDOW], ids=["full", "sliding"])
def test_a_reusing_layer_reads_its_targets_cache_and_stores_nothing(layout, owner):
    specs = [owner, FULL, ReuseSpec(0), NoCacheSpec()]
    cfg = MemoryConfig(64, 2, block_size=4, layout=layout, max_step=8)
    memory = build_memory(specs, cfg)
    alone = build_memory([owner, FULL], cfg)  # the same caches without the extra layers
    assert memory.usage().bytes_total == alone.usage().bytes_total
    assert sum(g.n_layers for g in memory.usage().groups) == 2
    view, ref = memory.prepare(batch()), alone.prepare(batch())
    for layer in (0, 1):
        q, k, v = qkv(layer)
        torch.testing.assert_close(view.attend(layer, q, k, v), ref.attend(layer, q, k, v))
    q2, _, _ = qkv(7)
    shared = view.attend(2, q2, None, None)  # layer 2 computes queries only
    k0, v0 = qkv(0)[1:]
    torch.testing.assert_close(shared, ref.attend(0, q2, k0, v0))  # = attending with layer 0's keys and values
    memory.integrity_check()
    state = memory.save_seq(0)
    assert {name.split(".")[-1] for name in state.tensors if name[:2] in ("k.", "v.")} == {"0", "1"}


def test_a_reuse_of_a_layer_that_stores_nothing_is_refused():
    with pytest.raises(ValueError, match="layer 1 reuses layer 2"):
        build_memory([FULL, ReuseSpec(2), ReuseSpec(0)], MemoryConfig(64, 2))
