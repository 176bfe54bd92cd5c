"""Memories made of others: hybrids of attention and recurrent layers, interleaved
sliding windows, layers that reuse another layer's cache."""
