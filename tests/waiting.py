"""The one way tests wait for an asynchronous effect: poll a condition until it holds,
with a deadline. Never a fixed sleep, never a read at once."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (and return that); raise
    TimeoutError after ``timeout`` s. The pause grows from 10 ms to 50 ms: a long wait
    does not keep asking (most predicates are HTTP calls the server under test answers
    on its event loop, beside the engine thread it is waiting on)."""
    deadline, pause = time.monotonic() + timeout, 0.01
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)
    raise TimeoutError(f"{what} not reached in {timeout} s")
