"""Which Triton kernels the CUDA hooks of norm.py, rotary.py and activation.py may use:
``ops`` is engine/kernels/triton_ops.py where Triton imports, else None; ``enabled``
False turns them off (bench/gpu_bench.py's "before" rows: torch's ops alone)."""

from __future__ import annotations

import torch

try:
    from engine.kernels import triton_ops as ops
except ImportError:  # no Triton (the CPU build): torch's ops
    ops = None

enabled = True


def usable(x: torch.Tensor) -> bool:
    """Whether a Triton kernel may take ``x`` (a CUDA tensor, with Triton, not turned off)."""
    return ops is not None and enabled and x.is_cuda
