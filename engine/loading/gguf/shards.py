"""A GGUF model cut into shards by llama.cpp's ``gguf-split`` (the hub's form for big
models): ``NAME-00001-of-0000N.gguf`` ... ``NAME-0000N-of-0000N.gguf``, each with the
keys ``split.no`` (0-based), ``split.count`` and ``split.tensors.count`` (the tensors of
all shards); the first shard holds the model's metadata, every shard some tensors.

As llama-server, the model is loaded from its first shard's name, the others found by
that pattern beside it; a shard's name other than the first also loads it (the
first is found the same way). A file that says it is one of several shards but is not
named so, a missing shard, or shards that disagree is a ValueError naming the file.
"""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

from engine.loading.gguf.header import GGUFHeader, TensorEntry, read_header

SHARD = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf", re.IGNORECASE)


def shard_paths(path: Path) -> list[Path]:
    """Every shard of the model ``path`` is one shard of, first to last; ``[path]`` for a
    file whose name is not a shard's."""
    m = SHARD.fullmatch(path.name)
    if m is None:
        return [path]
    prefix, count = m.group(1), int(m.group(3))
    return [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_model_header(path: Path) -> tuple[GGUFHeader, list[Path]]:
    """The first shard's metadata with every shard's tensors (each entry naming its
    shard), and the shards' paths. Raises ValueError (shards missing, misnamed or
    disagreeing; a malformed file), OSError."""
    paths = shard_paths(path)
    if not paths[0].is_file():
        raise ValueError(f"shard 1 of {len(paths)} is missing: {paths[0]}")
    first = read_header(paths[0])
    count = first.fields.get("split.count")
    if count is None and paths[0] == path:  # a name that looks like a shard's, of a whole model
        return first, [path]
    if count != len(paths):
        if len(paths) == 1:
            raise ValueError(f"{path.name} is shard 1 of {count} but not named NAME-00001-of-{count:05d}.gguf")
        raise ValueError(f"{paths[0].name} says split.count {count}, its name {len(paths)}")
    tensors: dict[str, TensorEntry] = {}
    for i, shard in enumerate(paths):
        if not shard.is_file():
            raise ValueError(f"shard {i + 1} of {count} is missing: {shard}")
        header = first if i == 0 else read_header(shard)
        if header.fields.get("split.no", 0) != i or header.fields.get("split.count", 1) != count:
            raise ValueError(f"{shard.name}: split.no / split.count do not make it shard {i + 1} of {count}")
        for name, entry in header.tensors.items():
            if name in tensors:
                raise ValueError(f"{shard.name}: tensor '{name}' is in an earlier shard too")
            tensors[name] = entry._replace(shard=i)
    expected = first.fields.get("split.tensors.count", len(tensors))
    if expected != len(tensors):
        raise ValueError(f"{paths[0].name}: split.tensors.count is {expected}, the shards hold {len(tensors)}")
    return GGUFHeader(first.fields, tensors), paths


class OpenShards:
    """Read access to every shard while tensors are read: a descriptor each, and with
    ``mapped`` a private copy-on-write mapping each (writable for torch.frombuffer,
    never written; a mapping outlives the descriptors, as long as tensors view it)."""

    def __init__(self, paths: list[Path], mapped: bool = False):
        self.fds = [os.open(p, os.O_RDONLY) for p in paths]
        self.maps = [mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) for fd in self.fds] if mapped else None

    def fd(self, entry: TensorEntry) -> int:
        return self.fds[entry.shard]

    def mapping(self, entry: TensorEntry) -> mmap.mmap | None:
        return self.maps[entry.shard] if self.maps is not None else None

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
