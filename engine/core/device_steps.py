"""How the engine's decode steps run on its device: the static step (and its CUDA
graphs) where the model and memory allow, and the report /props and /metrics show. A
mixin of ``Engine``, which owns the state it reads (config, device, model, memory, lora,
in_blocks, memory_config, n_ctx_seq, static)."""

from __future__ import annotations

import torch

from engine.core.cuda_graphs import GraphLadder
from engine.core.static_decode import StaticDecode, eligible_model


class DeviceSteps:
    def _static_decode(self) -> StaticDecode | None:
        """The static decode step (engine/core/static_decode.py): on CUDA unless the config
        says otherwise, captured as graphs unless ``enforce_eager``; None where it cannot serve."""
        cfg = self.config
        wanted = cfg.static_decode if cfg.static_decode is not None else self.device.type == "cuda"
        if not wanted or self.in_blocks or not eligible_model(self.model, self.memory, self.lora):
            return None
        static = StaticDecode(self.model, self.memory, self.device, cfg.n_seq_max, self.n_ctx_seq)
        if self.device.type == "cuda" and not cfg.enforce_eager:
            static.graphs = GraphLadder(static.forward, static.sizes, self.device)
        return static

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
