"""Compute kernels chosen at run time by the CPU's features: the oneDNN packed linear
(float32), with torch's own ops as the fallback."""

import torch  # noqa: F401 (the compiled units link against libtorch: it is loaded before any of them)
