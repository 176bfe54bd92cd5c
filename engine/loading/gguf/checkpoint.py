"""A GGUF file (llama.cpp, Ollama, LM Studio) as a checkpoint: its metadata turned into
the config.json a Hugging Face folder would have, its tensors read one at a time and
named as the Hugging Face checkpoint names them, and its tokenizer rebuilt
(engine/gguf_tokenizer.py). A tensor the model keeps in blocks (engine/kernels/blocks.py)
comes as the file's bytes, mapped (``mmap``, the default of the engine) or read; any
other is read and dequantized.

What each architecture's metadata and tensors stand for is in archs.py and tensors.py here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from engine.errors import CheckpointError
from engine.kernels.blocks import KEPT, BlockWeight
from engine.loading.gguf.archs import ARCHITECTURES, gguf_name
from engine.loading.gguf.shards import OpenShards, read_model_header
from engine.loading.gguf.tensors import expert_source, fused_rows

SUPPORTED = KEPT | {gguf.GGMLQuantizationType.F32}


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".gguf"


class GGUFCheckpoint:
    """Raises CheckpointError naming the problem: not a GGUF, an architecture or a
    tensor type slotserve cannot serve, a tensor the model needs that is missing."""

    def __init__(self, path: Path, mmap: bool = False):
        """``mmap``: tensors kept in blocks are read-only views of a private mapping of the
        file (its pages shared with the page cache and with other processes serving it,
        faulted in on first use); otherwise every tensor is read into memory of its own."""
        try:
            header, self.shards = read_model_header(path)
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable GGUF file: {exc}") from exc
        self.path, self.mmap = self.shards[0], mmap  # a split model: its first shard (shards.py)
        self.fields = header.fields
        self.tensors = header.tensors  # name -> (type, shape, offset, bytes); read with pread, one at a time
        self.arch = self.get("general.architecture")
        if self.arch not in ARCHITECTURES:
            supported = ", ".join(sorted(ARCHITECTURES))
            raise CheckpointError(f"{path}: GGUF architecture '{self.arch}' is not supported (supported: {supported})")
        for name, (qtype, *_) in self.tensors.items():
            if qtype not in SUPPORTED:
                kinds = ", ".join(sorted(t.name for t in SUPPORTED))
                raise CheckpointError(f"{path}: tensor '{name}' has type {qtype.name}, not supported (only {kinds})")

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def n_bytes(self) -> int:
        """Bytes of tensor data in the file (the dequantized model is larger)."""
        return sum(t[3] for t in self.tensors.values())

    @property
    def vocab_size(self) -> int:
        embd = self.tensors.get("token_embd.weight")
        return embd[1][0] if embd else len(self.get("tokenizer.ggml.tokens", []))

    def hf_config(self) -> dict:
        """The config.json a Hugging Face folder of this model would carry."""
        arch = ARCHITECTURES[self.arch]
        return {"architectures": [arch.hf_class]} | arch.config(self)

    def stored_type(self, names: Any, hf_name: str) -> tuple[gguf.GGMLQuantizationType, tuple[int, ...]] | None:
        """(type, row-major shape) of the GGUF tensor ``hf_name`` is read from, or None."""
        fused = fused_rows(self, hf_name)
        if fused is not None and fused[0] in self.tensors:  # its rows of a fused tensor (Phi-3)
            qtype, shape = self.tensors[fused[0]][:2]
            return qtype, (fused[2], *shape[1:])
        found = gguf_name(self, names, hf_name)
        if found not in self.tensors and expert_source(hf_name) is not None:
            found = expert_source(hf_name)[0]  # an expert's rows of the stacked tensor
        return self.tensors[found][:2] if found in self.tensors else None

    def tensor(self, name: str, files: OpenShards, blocks: bool = False) -> torch.Tensor | BlockWeight:
        """One tensor in row-major (Hugging Face) shape: with ``blocks``, a 2-D tensor of a
        kept type as its bytes (``BlockWeight``: a view of the shard's mapping when
        ``files`` maps them; stacked experts [E, out, in] as the 2-D [E * out, in]);
        otherwise float32 (float16 and bfloat16 stay as they are, for the copy into the
        model to convert). Read with ``os.preadv`` into a buffer of its own."""
        entry = self.tensors[name]
        qtype, shape, offset, n_bytes = entry[:4]
        fd, mapped = files.fd(entry), files.mapping(entry)
        keep = blocks and qtype in KEPT and len(shape) in (2, 3)
        rows = shape[0] * shape[1] if len(shape) == 3 else shape[0]  # stacked experts: [E * out, in]
        if keep and mapped is not None:
            if offset + n_bytes > len(mapped):
                raise CheckpointError(f"{self.path}: tensor '{name}' is cut short (file truncated?)")
            view = torch.frombuffer(mapped, dtype=torch.uint8, count=n_bytes, offset=offset)
            return BlockWeight.from_bytes(qtype, view, rows, shape[-1], mapped=True)
        buf = bytearray(n_bytes)
        if os.preadv(fd, [buf], offset) != n_bytes:
            raise CheckpointError(f"{self.path}: tensor '{name}' is cut short (file truncated?)")
        if keep:
            return BlockWeight.from_bytes(qtype, buf, rows, shape[-1])
        plain = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(qtype.name)
        if plain is not None:
            return torch.frombuffer(buf, dtype=plain).reshape(shape)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        values = gguf.quants.dequantize(np.frombuffer(buf, dtype=np.uint8).reshape(rows, -1), qtype)  # [rows, n]
        return torch.from_numpy(values.reshape(shape))

    def small_tensor(self, name: str) -> torch.Tensor:
        """A small tensor the config is derived from (Gemma 4's ``rope_freqs``), in float."""
        files = OpenShards(self.shards)
        try:
            return self.tensor(name, files).float()
        finally:
            files.close()

    def name_map(self) -> Any:
        """The ``gguf`` package's map from Hugging Face names to this file's."""
        return gguf.get_tensor_name_map(_model_arch(self.arch), self.get(f"{self.arch}.block_count"))

    def iter_hf_tensors(
        self, hf_names: list[str], keep: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, str, torch.Tensor | BlockWeight]]:
        """(file, HF name, tensor) for each name the model asks for; the names in ``keep``
        come in blocks where the file has them so (see ``tensor``). Tensors several HF
        tensors come from (stacked experts) are kept while one layer's names are read."""
        names = self.name_map()
        arch = ARCHITECTURES[self.arch]
        kept: dict[str, torch.Tensor] = {}
        files = OpenShards(self.shards, mapped=self.mmap and bool(keep))
        blocks = False  # whether the HF name being read is one kept in blocks

        def read(name: str) -> torch.Tensor | BlockWeight:
            if name in kept:
                return kept[name]
            if name not in self.tensors:
                raise CheckpointError(f"{self.path}: no tensor '{name}'")
            tensor = self.tensor(name, files, blocks)
            if len(self.tensors[name][1]) == 3:  # [experts, out, in]: one HF tensor per expert
                if kept and next(iter(kept)).split(".")[1] != name.split(".")[1]:
                    kept.clear()  # a new layer
                kept[name] = tensor
            return tensor

        try:
            for hf_name in hf_names:
                blocks = hf_name in keep
                found = gguf_name(self, names, hf_name)
                tensor = arch.tensor(self, hf_name, found or "", read) if arch.tensor else None
                if tensor is None:
                    if found is None or found not in self.tensors:
                        raise CheckpointError(f"{self.path}: no tensor for '{hf_name}' (looked for '{found}')")
                    tensor = read(found)
                yield self.path.name, hf_name, tensor
        finally:
            files.close()


def _model_arch(name: str) -> gguf.MODEL_ARCH:
    return next(arch for arch, n in gguf.MODEL_ARCH_NAMES.items() if n == name)
