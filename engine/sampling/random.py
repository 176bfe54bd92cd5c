"""Counter-based uniforms: a pure function of (seed, counter), so a seeded request draws
the same numbers whatever else shares its batch."""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """seeds, counters: [S] int64 -> [S] float64 in [0, 1), a pure function of its inputs."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    x = _mix32(lo ^ _mix32(hi ^ 0x9E3779B9))
    x = _mix32(x ^ _mix32(counters & _M32))
    return x.double() / 2.0**32
