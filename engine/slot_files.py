"""Slot files as the engine offers them: the save directory plus the file format, with
engine errors (``SlotError`` subclasses) instead of memory's. Usable before a model is
loaded (listing, deleting); reading checks a file against a model's fingerprint,
vocabulary and context before anything touches a slot."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.errors import BadSlotFile, SlotFileMissing, SlotWriteFailed
from memory import SeqState
from memory.files.slot_dir import MAX_NAME_CHARS, NAME_PATTERN, BadFileName, FileMissing, SlotDirectory, check_name
from memory.files.slot_file import SlotFile, SlotFileError, decode, encode, fingerprint_mismatch, fingerprint_of

__all__ = ["MAX_NAME_CHARS", "NAME_PATTERN", "SlotFileInfo", "SlotFiles", "lora_scales"]


FILE_KEYS = ("lora_scales",)  # what a file says of its own cache (not of the model): taken as given


def lora_scales(file: SlotFile, fingerprint: dict[str, str]) -> tuple[float, ...]:
    """The adapter scales the file's cache was computed with: one finite number per
    adapter of ``fingerprint``'s set; BadSlotFile otherwise (a 400, nothing touched)."""
    text = file.fingerprint.get("lora_scales", "")
    n_adapters = len(fingerprint["lora"].split(";")) if fingerprint.get("lora") else 0
    try:
        scales = tuple(float(s) for s in text.split(",") if s)
    except ValueError:
        raise BadSlotFile(f"the file's lora_scales {text[:64]!r} are not numbers") from None
    if text and (len(scales) != n_adapters or not all(math.isfinite(s) for s in scales)):
        raise BadSlotFile(f"the file's lora_scales {text[:64]!r} are not {n_adapters} finite numbers")
    return scales


@dataclass(frozen=True)
class SlotFileInfo:
    filename: str
    size: int
    n_tokens: int
    created: float
    memory_kind: str | None
    model: dict[str, str]
    model_match: bool


def _bad_name(exc: Exception) -> BadSlotFile:
    return BadSlotFile(str(exc), code="invalid_filename")


class SlotFiles:
    def __init__(self, root: Path):
        self.directory = SlotDirectory(root)

    @staticmethod
    def check_name(filename: str) -> str:
        try:
            return check_name(filename)
        except BadFileName as exc:
            raise _bad_name(exc) from None

    def write(
        self, filename: str, tokens: list[int], state: SeqState, fingerprint: dict[str, str], progress=None
    ) -> int:
        """Encode and write atomically; returns the bytes written. ``progress(bytes done,
        of total)`` hears of the write."""
        data = encode(tokens, state, fingerprint)
        try:
            return self.directory.write(filename, data, progress)
        except BadFileName as exc:
            raise _bad_name(exc) from None
        except IsADirectoryError:
            raise BadSlotFile(f"{filename!r} is a directory", code="invalid_filename") from None
        except OSError as exc:
            raise SlotWriteFailed(f"writing the slot file failed: {exc.strerror}") from None

    def read(
        self, filename: str, fingerprint: dict[str, str], vocab_size: int, n_ctx: int, progress=None, lowest: int = 0
    ) -> tuple[SlotFile, int]:
        """The whole file, checked against the model; returns it and its size in bytes.
        ``lowest``: the lowest token id the file may hold (below 0: a model that takes
        images, whose slots hold their images as keys: engine/core/media.py)."""
        try:
            data = self.directory.read(filename, progress)
            file = decode(data)
        except FileMissing as exc:
            raise SlotFileMissing(str(exc)) from None
        except BadFileName as exc:
            raise _bad_name(exc) from None
        except SlotFileError as exc:
            raise BadSlotFile(str(exc)) from None
        taken = {k: file.fingerprint[k] for k in FILE_KEYS if k in file.fingerprint and "lora" in fingerprint}
        reason = fingerprint_mismatch(file.fingerprint, {**fingerprint, **taken})
        if reason:
            raise BadSlotFile(reason, code="model_mismatch")
        if file.tokens and (min(file.tokens) < lowest or max(file.tokens) >= vocab_size):
            raise BadSlotFile(f"the file holds token ids outside the vocabulary [0, {vocab_size})")
        lora_scales(file, fingerprint)
        if len(file.tokens) > n_ctx:
            raise BadSlotFile(
                f"the file holds {len(file.tokens)} tokens but the slot's context is {n_ctx}",
                code="exceed_context_size_error",
                n_prompt_tokens=len(file.tokens),
                n_ctx=n_ctx,
            )
        positions = file.state.positions
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n_ctx):
            raise BadSlotFile(f"the file holds positions outside the slot's context [0, {n_ctx})")
        return file, len(data)

    def list(self, fingerprint: dict[str, str] | None) -> list[SlotFileInfo]:
        out = []
        for e in self.directory.list():
            model = fingerprint_of(e.meta)
            match = fingerprint is not None and fingerprint_mismatch(model, fingerprint) is None
            kind = e.meta.get("memory.memory_kind")
            kind = "kv_unified" if kind == "kv" else kind  # the name files had before the kinds were named
            out.append(SlotFileInfo(e.filename, e.size, e.n_tokens, e.created, kind, model, match))
        return out

    def delete(self, filename: str) -> None:
        try:
            self.directory.delete(filename)
        except FileMissing as exc:
            raise SlotFileMissing(str(exc)) from None
        except BadFileName as exc:
            raise _bad_name(exc) from None
        except SlotFileError as exc:
            raise BadSlotFile(str(exc), code="not_a_slot_file") from None
