"""Sizing the KV pool from free GPU memory (vLLM's ``--gpu-memory-utilization``).

After the weights are loaded, the pool takes what is left of ``utilization`` x the
card's memory, less a reserve for activations, CUDA graphs and the allocator's slack;
``-c`` stays a cap, so a pool is never larger than asked. Memory used by other
processes counts as used.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from engine.config import EngineConfig
from memory import LayerSpec, MemoryConfig, cache_bytes

log = logging.getLogger("slotserve.engine")

RESERVE = 1 << 30  # activations of a step of -ub tokens, graph pools, allocator slack


def gpu_sized(mc: MemoryConfig, specs: list[LayerSpec], config: EngineConfig, device: torch.device) -> MemoryConfig:
    """``mc`` with its cells capped by what fits in free GPU memory. Raises ValueError
    when not even one block per sequence fits."""
    free, total = torch.cuda.mem_get_info(device)
    allowed = int(total * config.gpu_memory_utilization) - (total - free) - RESERVE
    per_token = cache_bytes(specs, 1) - cache_bytes(specs, 0)  # bytes of one cell in every layer
    fixed = cache_bytes(specs, 0, mc.n_seq_max)  # recurrent states, whatever the cells
    fit = (allowed - fixed) // per_token if per_token else mc.n_ctx
    if fit < mc.n_seq_max * mc.block_size:
        raise ValueError(
            f"the KV cache does not fit in GPU memory: {allowed / 2**30:.2f} GiB left of "
            f"{config.gpu_memory_utilization:.2f} x {total / 2**30:.1f} GiB after the weights "
            "(raise --gpu-memory-utilization or use a smaller model)"
        )
    cells = min(mc.n_ctx, fit)
    log.info(
        "KV cache: %d cells (%.2f GiB); %d fit in %.0f%% of %.1f GiB (-c %d caps it)",
        cells, cells * per_token / 2**30, fit, 100 * config.gpu_memory_utilization, total / 2**30, mc.n_ctx,
    )  # fmt: skip
    return dataclasses.replace(mc, n_ctx=cells)
