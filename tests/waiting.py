"""The one way tests wait for an asynchronous effect: poll a condition until it holds,
with a deadline. Never a fixed sleep, never a read at once."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (and return that); raise
    TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.01)
    raise TimeoutError(f"{what} not reached in {timeout} s")
