"""Which Triton kernels the CUDA hooks of norm.py, rotary.py and activation.py may use:
``ops`` is engine/kernels/triton_ops.py where Triton imports, else None.

Only while decode graphs are warmed up and captured (``in_graphs``): a graph replays a
launch for a few microseconds of GPU time, but an eager Triton launch costs its Python
launcher ~100 us of host time, which made eager steps 3-5x slower on the H100 than
torch's ops (bench/gpu_bench.py, docs/benchmarks.md). ``enabled`` False turns them off
everywhere (the benchmark's torch-only rows)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

try:
    from engine.kernels import triton_ops as ops
except ImportError:  # no Triton (the CPU build): torch's ops
    ops = None

enabled = True
_graphs = 0  # > 0 while decode graphs are warmed up or captured


@contextmanager
def in_graphs():
    """The Triton kernels take the ops they can inside this block (cuda_graphs.py)."""
    global _graphs
    _graphs += 1
    try:
        yield
    finally:
        _graphs -= 1


def usable(x: torch.Tensor) -> bool:
    """Whether a Triton kernel takes ``x``: a CUDA tensor, with Triton, while graphs are made."""
    return ops is not None and enabled and _graphs > 0 and x.is_cuda
