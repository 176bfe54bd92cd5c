"""Hashes of a token list's whole blocks, each over its tokens and the hash before it
(vLLM's automatic prefix caching): equal hashes mean equal tokens from position 0 up to
that block's end, so a block found by its hash holds exactly that prefix's cache."""

from __future__ import annotations

import hashlib
from array import array


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """One 16-byte hash per whole block of ``tokens`` (a last partial block has none)."""
    out, h = [], b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.blake2b(h, digest_size=16)
        digest.update(array("q", tokens[start : start + block_size]).tobytes())
        h = digest.digest()
        out.append(h)
    return out
