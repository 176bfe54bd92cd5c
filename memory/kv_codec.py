"""How an attention cache stores a row of ``head_dim`` values (llama-server's cache types,
``-ctk``/``-ctv``): as float32, float16 or bfloat16 values, or as q8_0 blocks.

A stored row is the last dimension of a cache tensor; every other dimension (cells,
sequences, heads) is indexed, copied and sliced the same whatever the type, so the
stores (paged pool, streams, rings) only ever call ``encode`` on what they write and
``decode`` on what they hand to attention. q8_0 packs a row as ``head_dim`` int8 values
followed by one float16 scale per 32 of them (``head_dim + head_dim / 16`` bytes;
llama.cpp's block_q8_0 content, scales after the values): value = scale * q, scale =
max|x| / 127 over the 32, so each value moves by at most scale / 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCodec:
    name: str  # llama-server's name: f32, f16, bf16, q8_0
    storage: torch.dtype  # the cache tensor's dtype
    block: int = 0  # values per scale (q8_0: 32); 0: plain values

    def width(self, head_dim: int) -> int:
        """Elements of ``storage`` one stored row of ``head_dim`` values takes."""
        return head_dim + 2 * (head_dim // self.block) if self.block else head_dim

    def bytes_per_row(self, head_dim: int) -> int:
        return self.width(head_dim) * torch.empty((), dtype=self.storage).element_size()

    def check(self, head_dim: int) -> None:
        if self.block and head_dim % self.block:
            raise ValueError(f"a {self.name} cache needs head_dim divisible by {self.block}, got {head_dim}")

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] (any float dtype) -> stored rows [..., width(D)]."""
        if not self.block:
            return x.to(self.storage)
        lead, d = x.shape[:-1], x.shape[-1]
        groups = x.float().reshape(*lead, d // self.block, self.block)  # [..., G, 32]
        scale = (groups.abs().amax(-1, keepdim=True) / 127).to(torch.float16)  # [..., G, 1]
        inv = torch.where(scale > 0, 1 / scale.float(), torch.zeros((), dtype=torch.float32))
        q = (groups * inv).round_().clamp_(-127, 127).to(torch.int8)  # [..., G, 32]
        return torch.cat([q.reshape(*lead, d).view(torch.uint8), scale.reshape(*lead, -1).view(torch.uint8)], -1)

    def decode(self, rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Stored rows [..., width(D)] -> values [..., D] in ``dtype``."""
        if not self.block:
            return rows.to(dtype)
        width = rows.shape[-1]
        d = width * self.block // (self.block + 2)
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        q = rows[..., :d].view(torch.int8).float().unflatten(-1, (d // self.block, self.block))  # [..., G, 32]
        scale = rows[..., d:].contiguous().view(torch.float16).float()  # [..., G]
        return (q * scale[..., None]).flatten(-2).to(dtype)  # [..., D]


CODECS = {
    "f32": KVCodec("f32", torch.float32),
    "f16": KVCodec("f16", torch.float16),
    "bf16": KVCodec("bf16", torch.bfloat16),
    "q8_0": KVCodec("q8_0", torch.uint8, block=32),
}
_BY_DTYPE = {c.storage: c for c in CODECS.values() if not c.block}


def codec(name: str | None, dtype: torch.dtype) -> KVCodec:
    """The codec called ``name``, or for None the plain codec of ``dtype``."""
    if name is None:
        return _BY_DTYPE[dtype]
    if name not in CODECS:
        raise ValueError(f"unknown cache type '{name}' (one of {', '.join(CODECS)})")
    return CODECS[name]
