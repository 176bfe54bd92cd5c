"""The slot save directory: safe names, atomic writes, listing and deletion.

Names are one path component; the resolved path (symlinks followed) must stay inside
the directory. A write goes to a hidden temporary file in the same directory
(``.slotserve-<host>-<pid>-<random>.tmp``), is fsynced, renamed over the target and the
directory is fsynced, so a crash at any moment leaves the old file or the new one.
Temporary files start with a dot, which no slot file name may, so they are never listed
or restored. A writer killed mid-write leaves its temporary file: ``sweep`` (at start,
and from the disk tier's rescans) removes those whose writer is gone — this host's
process no longer alive, or older than STALE_S whoever wrote it (a directory shared
by replicas) — and ``tmp_bytes`` says what the ones left take.
Files are the owner's alone (``FILE_MODE``, 0600): they hold a conversation's token ids.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from memory.files.slot_file import SlotFileError, check_header

TMP_PREFIX = ".slotserve-"
TMP_SUFFIX = ".tmp"
STALE_S = 3600.0  # a temporary file this old is an orphan, whoever wrote it
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:32] or "host"
FILE_MODE = 0o600  # slot files and prompt-cache entries hold prompts' token ids: owner only
_CHUNK = 16 << 20  # bytes per write call


class BadFileName(SlotFileError):
    """The name is not an allowed slot file name, or resolves outside the directory."""


class FileMissing(SlotFileError):
    pass


@dataclass(frozen=True)
class FileEntry:
    filename: str
    size: int
    n_tokens: int
    created: float
    meta: dict[str, str]


MAX_NAME_CHARS = 63  # 63 characters of at most 4 UTF-8 bytes each fit any filesystem's 255-byte name
_NAME_CHAR = r"[^./\\\x00-\x1f\x7f]"  # no separator, dot or control character
NAME_PATTERN = rf"^{_NAME_CHAR}+(\.{_NAME_CHAR}+)*\.?$"  # no leading dot, never two dots in a row


def check_name(filename: str) -> str:
    """Raise BadFileName unless ``filename`` is one safe path component: 1 to 63
    characters matching ``NAME_PATTERN`` (the rule the OpenAPI document states)."""
    if not isinstance(filename, str) or not filename:
        raise BadFileName("filename must be a non-empty string")
    if len(filename) > MAX_NAME_CHARS:
        raise BadFileName(f"filename is longer than {MAX_NAME_CHARS} characters")
    if "/" in filename or "\\" in filename or ".." in filename:
        raise BadFileName("filename must be one path component (no '/', '\\' or '..')")
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in filename):
        raise BadFileName("filename contains a control character or a lone surrogate")
    if filename.startswith("."):
        raise BadFileName("filename must not start with '.'")
    if not re.fullmatch(NAME_PATTERN, filename):  # the checks above, as one rule
        raise BadFileName("filename is not a valid slot file name")
    return filename


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class SlotDirectory:
    def __init__(self, root: Path):
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(f"slot save path {root} is not a directory")
        self.sweep()  # what writers killed mid-write left

    def _temporaries(self) -> list[os.DirEntry]:
        try:
            return [
                e
                for e in os.scandir(self.root)
                if e.name.startswith(TMP_PREFIX) and e.name.endswith(TMP_SUFFIX) and e.is_file(follow_symlinks=False)
            ]
        except OSError:
            return []

    def sweep(self) -> int:
        """Remove the temporary files of writers that are gone; returns how many."""
        removed, now = 0, time.time()
        for entry in self._temporaries():
            parts = entry.name[len(TMP_PREFIX) : -len(TMP_SUFFIX)].rsplit("-", 2)
            mine = len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit()
            try:
                stale = now - entry.stat(follow_symlinks=False).st_mtime > STALE_S
            except OSError:
                continue
            if stale or (mine and not _alive(int(parts[1]))):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
        return removed

    def tmp_bytes(self) -> int:
        """What the temporary files now in the directory take (writes in progress, orphans)."""
        total = 0
        for entry in self._temporaries():
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass
        return total

    def path(self, filename: str) -> Path:
        """The file's path; raises BadFileName for a bad name or one that leaves the directory."""
        path = self.root / check_name(filename)
        resolved = path.resolve(strict=False)
        if resolved == self.root or not resolved.is_relative_to(self.root):
            raise BadFileName(f"filename {filename!r} resolves outside the slot save path")
        return path

    def write(self, filename: str, data: bytes, progress: Callable[[int, int], None] | None = None) -> int:
        """Atomically replace ``filename`` with ``data``; returns the bytes written.
        ``progress(bytes done, of total)`` hears of each chunk."""
        target = self.path(filename)
        tmp = self.root / f"{TMP_PREFIX}{_HOST}-{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            try:
                view, done = memoryview(data), 0
                while done < len(view):  # a write may be short (a nearly full disk): go on from there
                    done += os.write(fd, view[done : done + _CHUNK])
                    if progress is not None:
                        progress(done, len(view))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._sync_dir()
        return len(data)

    def read(self, filename: str, progress: Callable[[int, int], None] | None = None) -> bytes:
        """The file's bytes, read once into one buffer (the file is mapped; its pages
        are read chunk by chunk so ``progress(bytes done, of total)`` hears of each)."""
        path = self.path(filename)
        try:
            with open(path, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                if total == 0:
                    return b""
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    for start in range(0, total, _CHUNK) if progress is not None else ():
                        end = min(start + _CHUNK, total)
                        mapped[start:end]  # brings that chunk's pages in (a transient chunk-sized copy)
                        progress(end, total)
                    return mapped[:]
        except (FileNotFoundError, IsADirectoryError):
            raise FileMissing(f"slot file {filename!r} does not exist") from None

    def delete(self, filename: str) -> None:
        """Remove a slot file (only files that are slot files)."""
        path = self.path(filename)
        if not path.is_file():
            raise FileMissing(f"slot file {filename!r} does not exist")
        self.header(path)
        path.unlink()
        self._sync_dir()

    def list(self) -> list[FileEntry]:
        """Every slot file, by name; other files and temporary files are left out."""
        out = []
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                meta = self.header(path)
                out.append(
                    FileEntry(path.name, path.stat().st_size, int(meta["n_tokens"]), float(meta["created"]), meta)
                )
            except (SlotFileError, KeyError, ValueError, OSError):
                continue
        return out

    @staticmethod
    def header(path: Path) -> dict[str, str]:
        """A file's metadata (reads the header only); raises SlotFileError."""
        try:
            with safe_open(path, "pt") as f:
                meta = f.metadata()
        except Exception as exc:  # safetensors raises several types for a bad header
            raise SlotFileError(f"{path.name}: not a readable safetensors file: {exc}") from None
        return check_header(meta)

    def _sync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
