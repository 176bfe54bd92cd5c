"""The header of a GGUF file, read in one pass with ``struct``: the metadata as Python
values and the table of tensors (type, shape, where their bytes are).

gguf-py's ``GGUFReader`` builds a numpy view for every element of every array (each
token of the vocabulary, each merge), which costs ~0.4 s for the demo model's 4k-token
vocabulary and seconds for a 150k one; this reads the same fields as plain values.

Layout (little-endian, versions 2 and 3): magic ``GGUF``, u32 version, u64 tensor count,
u64 metadata count; each metadata entry a string key, a u32 value type and its value
(arrays: u32 element type, u64 count, the elements); each tensor a string name, u32
dimension count, u64 dimensions (innermost first), u32 GGML type, u64 offset from the
data section, which starts at the next multiple of ``general.alignment`` (32 by default).
A string is a u64 byte length and its UTF-8 bytes.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import gguf

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
NOT_TEXT = object()  # a string field whose bytes are not UTF-8: the field reads as None


class TensorEntry(NamedTuple):
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # row-major (outermost first)
    offset: int  # from the start of the file
    n_bytes: int
    shard: int = 0  # which file of a split model (engine/loading/gguf/shards.py)


class GGUFHeader(NamedTuple):
    fields: dict[str, Any]  # key -> int, float, bool, str, list, or None (undecodable text)
    tensors: dict[str, TensorEntry]


class _Cursor:
    """Reads values one after another from a buffer; raises ValueError past its end."""

    def __init__(self, buf: mmap.mmap | bytes):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"the header ends early (at byte {self.pos})")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def many(self, fmt: str, n: int) -> list:
        size = struct.calcsize("<" + fmt) * n
        if self.pos + size > len(self.buf):
            raise ValueError(f"the header ends early (at byte {self.pos})")
        values = struct.unpack_from(f"<{n}{fmt}", self.buf, self.pos)
        self.pos += size
        return list(values)

    def string(self) -> Any:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"the header ends early (a string of {n} bytes at byte {self.pos})")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return NOT_TEXT

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = self.take("I"), self.take("Q")
            if item in SCALARS:
                return self.many(SCALARS[item], n)
            return [self.value(item) for _ in range(n)]
        if kind not in SCALARS:
            raise ValueError(f"unknown metadata value type {kind} at byte {self.pos}")
        return self.take(SCALARS[kind])


def _plain(value: Any) -> Any:
    """NOT_TEXT anywhere in a field makes the whole field None (as gguf-py's reader)."""
    if value is NOT_TEXT or (isinstance(value, list) and any(v is NOT_TEXT for v in value)):
        return None
    return value


def read_header(path: Path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file at ``path``. Raises ValueError for
    anything that is not a well-formed little-endian GGUF of version 2 or 3 (bad magic,
    a header or tensor data past the end of the file, an unknown value or tensor type,
    a key or tensor given twice), OSError when it cannot be read."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError(f"{size} bytes: too short for a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf), size)


def _parse(cur: _Cursor, size: int) -> GGUFHeader:
    if cur.buf[:4] != MAGIC:
        raise ValueError("no GGUF magic at the start of the file")
    cur.pos = 4
    version = cur.take("I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (only {', '.join(map(str, VERSIONS))} are read)")
    n_tensors, n_fields = cur.take("Q"), cur.take("Q")
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = cur.string()
        if key is NOT_TEXT or key in fields:
            raise ValueError(f"a metadata key given twice or not UTF-8: {key!r}")
        kind = cur.take("I")
        if key == "general.alignment" and kind != 4:
            raise ValueError("general.alignment is not a u32")
        fields[key] = _plain(cur.value(kind))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a power of two")
    table = [_tensor_info(cur) for _ in range(n_tensors)]
    data = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorEntry] = {}
    for name, entry in table:
        if name is NOT_TEXT or name in tensors:
            raise ValueError(f"a tensor given twice or not UTF-8: {name!r}")
        entry = entry._replace(offset=data + entry.offset)
        if entry.offset + entry.n_bytes > size:
            raise ValueError(f"tensor '{name}' ends past the end of the file")
        tensors[name] = entry
    return GGUFHeader(fields, tensors)


def _tensor_info(cur: _Cursor) -> tuple[Any, TensorEntry]:
    name = cur.string()
    dims = cur.many("Q", cur.take("I"))  # innermost first
    qtype = gguf.GGMLQuantizationType(cur.take("I"))  # ValueError for an unknown type
    offset = cur.take("Q")
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_bytes = math.prod(dims) * type_size // block
    return name, TensorEntry(qtype, tuple(reversed(dims)), offset, n_bytes)
