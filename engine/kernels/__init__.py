"""Compute kernels chosen at run time by the CPU's features: the oneDNN packed linear
(float32), with torch's own ops as the fallback."""
