"""Attention caches: per-stream and paged K/V, sliding windows, their codecs, views and
block pool."""
