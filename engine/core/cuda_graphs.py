"""CUDA graphs of the static decode step (static_decode.py), one per ladder size.

Captured once at start-up, largest size first, into one shared memory pool (each
size's activations reuse the same device memory; only one replays at a time). Before
each capture the size runs once eagerly, so Triton compiles its kernels and cuBLAS
picks its algorithms outside the capture. The warm-up and the capture read the step
buffer as it is at start-up: every row attends to cell 0 of sequence 0's first block and
writes its key there, a cell that holds nothing yet (no sequence has run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from engine.kernels import cuda_ops

log = logging.getLogger("slotserve.engine")


class GraphLadder:
    def __init__(self, forward: Callable[[int], torch.Tensor], sizes: list[int], device: torch.device):
        """``forward(size)`` -> logits [size, V], reading only static buffers."""
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        t0 = time.perf_counter()
        with torch.inference_mode(), cuda_ops.in_graphs():  # as the steps that replay them; Triton's small ops
            self._capture(forward, sizes, device)
        self.seconds = time.perf_counter() - t0
        log.info("captured %d decode graphs (batch 1..%d) in %.1f s", len(sizes), max(sizes), self.seconds)

    def _capture(self, forward: Callable[[int], torch.Tensor], sizes: list[int], device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for size in sorted(sizes, reverse=True):
                forward(size)  # warm-up: compile and choose kernels outside the capture
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        for i, size in enumerate(sorted(sizes, reverse=True)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = forward(size)
            self.graphs[size] = graph
            log.info("capturing decode graphs: %d/%d (batch %d)", i + 1, len(sizes), size)
        torch.cuda.synchronize(device)

    def replay(self, size: int) -> torch.Tensor:
        """Replay the graph of ``size`` -> its logits [size, V] (a static tensor, rewritten
        by the next replay)."""
        self.graphs[size].replay()
        return self.outputs[size]
