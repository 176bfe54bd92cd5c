"""The slot file format: one sequence's tokens, positions and cache, as safetensors.

Layout-independent: the tensors are the sequence's cells gathered in cell order
(``k.<layer>`` / ``v.<layer>``: [n, kv_heads, head_dim]; recurrent kinds add their
states), so a file restores into any block size or layout. Metadata (all strings):

- ``format`` = ``slotserve-slot``, ``version`` = ``1``
- ``model.*``: the model fingerprint (architecture, config hash, weights hash, dtype)
- ``memory.*``: what the memory kind put in the state (kind, layers)
- ``n_tokens``, ``created`` (unix seconds), ``checksum`` (see ``checksum``)

The encoder and decoder work on bytes; the directory (slot_dir.py) does the I/O.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from memory.protocol import SeqState

FORMAT = "slotserve-slot"
VERSION = "1"
_RESERVED = ("tokens", "positions")


class SlotFileError(Exception):
    """A slot file that cannot be used; the message says why (safe to show a client)."""


@dataclass
class SlotFile:
    tokens: list[int]
    state: SeqState
    meta: dict[str, str]

    @property
    def fingerprint(self) -> dict[str, str]:
        return fingerprint_of(self.meta)


def fingerprint_of(meta: dict[str, str]) -> dict[str, str]:
    """The ``model.*`` entries of a file's metadata, without the prefix."""
    return {k[len("model.") :]: v for k, v in meta.items() if k.startswith("model.")}


def checksum(meta: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the metadata (without ``checksum``) and, in name order, each tensor's
    name, dtype, shape and bytes: any changed byte of the file changes it or breaks parsing."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in meta.items() if k != "checksum"}, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"\n{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def encode(tokens: list[int], state: SeqState, fingerprint: dict[str, str]) -> bytes:
    """The file's bytes for ``tokens`` (one per cell of ``state``)."""
    n = int(state.positions.numel())
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} tokens for {n} cells")
    clash = set(state.tensors) & set(_RESERVED)
    if clash:
        raise ValueError(f"state tensor names {sorted(clash)} are reserved")
    tensors = {
        "tokens": torch.tensor(tokens, dtype=torch.int64),  # [n]
        "positions": state.positions.to(torch.int64).contiguous(),  # [n]
        **{name: t.contiguous() for name, t in state.tensors.items()},
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "n_tokens": str(n),
        "created": f"{time.time():.3f}",
        **{f"model.{k}": v for k, v in fingerprint.items()},
        **{f"memory.{k}": v for k, v in state.meta.items()},
    }
    meta["checksum"] = checksum(meta, tensors)
    return st_save(tensors, metadata=meta)


def check_header(meta: dict[str, str] | None) -> dict[str, str]:
    """Format and version of a file's metadata; raises SlotFileError."""
    meta = meta or {}
    if meta.get("format") != FORMAT:
        raise SlotFileError("not a slotserve slot file (format field missing or different)")
    if meta.get("version") != VERSION:
        raise SlotFileError(f"slot file version {meta.get('version')!r} is not supported (this server reads {VERSION})")
    return meta


def decode(data: bytes) -> SlotFile:
    """Parse and verify a whole file (format, version, checksum, shapes).

    Does not check the model fingerprint or the vocabulary: see ``fingerprint_mismatch``.
    """
    try:
        tensors = st_load(data)
        meta = _metadata(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise SlotFileError(f"not a readable safetensors file (truncated or corrupted): {exc}") from None
    meta = check_header(meta)
    if meta.get("checksum") != checksum(meta, tensors):
        raise SlotFileError("checksum mismatch: the file is corrupted")
    tokens, positions = tensors.pop("tokens", None), tensors.pop("positions", None)
    n = meta.get("n_tokens", "")
    if tokens is None or positions is None or tokens.dim() != 1 or positions.shape != tokens.shape:
        raise SlotFileError("tokens and positions must be two [n] tensors")
    if tokens.dtype != torch.int64 or positions.dtype != torch.int64 or n != str(tokens.numel()):
        raise SlotFileError("tokens and positions must be int64 and hold n_tokens entries")
    memory_meta = {k[len("memory.") :]: v for k, v in meta.items() if k.startswith("memory.")}
    return SlotFile(tokens.tolist(), SeqState(positions, tensors, memory_meta), meta)


def _metadata(data: bytes) -> dict[str, str] | None:
    if len(data) < 8:
        raise ValueError("shorter than the header length")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("header runs past the end of the file")
    return json.loads(data[8 : 8 + n].decode()).get("__metadata__")


def fingerprint_mismatch(file_fp: dict[str, str], ours: dict[str, str]) -> str | None:
    """Why a file of model ``file_fp`` can't load into model ``ours``; None if it can."""
    diff = [k for k in sorted(set(file_fp) | set(ours)) if file_fp.get(k) != ours.get(k)]
    if not diff:
        return None
    parts = [f"{k} {file_fp.get(k, '?')[:16]!r} (file) vs {ours.get(k, '?')[:16]!r} (server)" for k in diff]
    return "the slot file was saved from another model: " + "; ".join(parts)
