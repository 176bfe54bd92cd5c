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


class ProgressLine:
    def __init__(self, what: str, stream: TextIO | None = None, every: float = 5.0):
        self.what, self.every = what, every
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = float("-inf")
        self.state: dict[str, int] = {}

    def __call__(self, done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        """One step: ``done`` of ``total`` items, ``done_bytes`` of ``total_bytes``."""
        self.state = {"done": done, "total": total, "bytes_done": done_bytes, "bytes_total": total_bytes}
        pct = 100 * done_bytes / total_bytes if total_bytes else 100.0
        text = f"{self.what}: {done}/{total} tensors, {_mb(done_bytes)} of {_mb(total_bytes)} ({pct:.0f}%)"
        finished = done >= total
        now = time.monotonic()
        if self.live:
            self.stream.write("\r" + text + ("\n" if finished else ""))
            self.stream.flush()
        elif finished or now - self._last >= self.every:
            self._last = now
            log.info("%s", text)
