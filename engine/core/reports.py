"""What an Engine reports of itself (/props, /metrics, /health): where and how the model
runs, and its memory's use and integrity. A mixin of ``Engine``, which owns the state it
reads (``device``, ``config``, ``static``, ``memory``, ``memory_config``)."""

from __future__ import annotations

import torch

from memory import MemoryError_


class EngineReports:
    """Reports read from the thread that steps the engine."""

    def device_report(self) -> dict:
        """Where and how the model runs (/props, /metrics): device, its name, dtype, the
        KV pool's bytes and cells, and how decode steps run."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        if self.static is None:
            decode = "general"
        else:
            decode = "cuda_graphs" if self.static.graphs is not None else "static_eager"
        return {
            "type": self.device.type,
            "name": name,
            "dtype": self.config.dtype,
            "kv_bytes": self.memory.usage().bytes_total,
            "kv_cells": self.memory_config.n_ctx,
            "decode": decode,
            "graph_batch_sizes": self.static.sizes if self.static is not None and self.static.graphs else [],
        }

    def memory_report(self) -> dict:
        """Usage of the memory and the result of its integrity check (call it from the
        thread that steps the engine)."""
        usage = self.memory.usage()
        try:
            self.memory.integrity_check()
            integrity = "ok"
        except MemoryError_ as exc:
            integrity = str(exc)
        groups = [
            {
                "kind": g.kind,
                "n_layers": g.n_layers,
                "block_size": g.block_tokens,
                "n_blocks_total": g.n_blocks_total,
                "n_blocks_used": g.n_blocks_used,
                "bytes_total": g.bytes_total,
                "bytes_used": g.bytes_used,
            }
            for g in usage.groups
        ]
        return {
            "kind": usage.kind,
            "layout": self.memory_config.layout,
            "n_cells_used": usage.n_cells_used,
            "bytes_total": usage.bytes_total,
            "bytes_used": usage.bytes_used,
            "usage_ratio": usage.ratio,
            "groups": groups,
            "integrity": integrity,
        }
