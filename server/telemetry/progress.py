"""Progress of a long task (a model load, a big slot save or restore) for whoever
watches: one line rewritten in place on a terminal, a log line every few seconds (and
at the end) otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("slotserve")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


SLOT_FILE_MIN_BYTES = 100_000_000  # slot saves and restores smaller than this report nothing


class ProgressLine:
    """``min_bytes``: say nothing for a task smaller than this."""

    def __init__(self, what: str, stream: TextIO | None = None, every: float = 5.0, min_bytes: int = 0):
        self.what, self.every, self.min_bytes = what, every, min_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = float("-inf")
        self.state: dict[str, int] = {}

    def __call__(self, done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        """One step: ``done`` of ``total`` items, ``done_bytes`` of ``total_bytes``."""
        self.state = {"done": done, "total": total, "bytes_done": done_bytes, "bytes_total": total_bytes}
        if total_bytes < self.min_bytes:
            return
        pct = 100 * done_bytes / total_bytes if total_bytes else 100.0
        text = f"{self.what}: {done}/{total} tensors, {_mb(done_bytes)} of {_mb(total_bytes)} ({pct:.0f}%)"
        finished = done >= total
        self._show(text, finished)

    def bytes(self, done: int, total: int) -> None:
        """A step of a task counted in bytes only (a slot file being written or read)."""
        if total < self.min_bytes:
            return
        pct = 100 * done / total if total else 100.0
        self._show(f"{self.what}: {_mb(done)} of {_mb(total)} ({pct:.0f}%)", done >= total)

    def _show(self, text: str, finished: bool) -> None:
        now = time.monotonic()
        if self.live:
            self.stream.write("\r" + text + ("\n" if finished else ""))
            self.stream.flush()
        elif finished or now - self._last >= self.every:
            self._last = now
            log.info("%s", text)
