"""Cache storage whose memory is committed only where it is written.

On the CPU a cache tensor is an anonymous memory mapping: the kernel hands out zeroed
pages on first touch, so a server started with a large ``-c`` holds in RSS only the
cells it has used (the high-water mark: freed cells keep their pages for reuse). Cells
never written read as zeros, which keeps masked-out cells finite (a garbage NaN in a
masked value would still poison attention: 0 x NaN = NaN). Other devices get plain
zeros.
"""

from __future__ import annotations

import math
import mmap

import torch


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu" or not math.prod(shape):
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    buffer = mmap.mmap(-1, math.prod(shape) * itemsize)  # anonymous, private, zero-filled on first touch
    return torch.frombuffer(buffer, dtype=dtype).view(shape)  # the tensor keeps the mapping alive
