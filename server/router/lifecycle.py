"""A router child's state: one small state machine, the only place it lives.

```
unloaded -> loading -> loaded <-> reserved
   ^  ^        |         |          |
   |  |        v         v          v
   |  +---- failed     stopping <---+        (loading -> stopping: unloaded mid-load)
   |                     |
   +---------------------+
any state -> removed     (the model left the catalog: its waiters get a 404)
```

- ``loading``: its server process runs and is not ready yet; a process that exits now
  (a crash, a bad flag, a failed spawn) is a load failure: ``failed``, counted, its
  error shown, and the waiters that asked for this load get it.
- ``loaded``: takes requests. A process that exits now is a crash: ``unloaded``,
  counted and logged; the next request starts it again.
- ``reserved``: picked to make room while busy: takes no new request, stops when idle;
  back to ``loaded`` when no longer needed.
- ``stopping``: SIGTERM sent, it drains (up to ``--drain-timeout``, then SIGKILL).
- ``failed``: the next request (not one of those that saw it fail) tries again.
"""

from __future__ import annotations

TRANSITIONS: dict[str, frozenset[str]] = {
    "unloaded": frozenset({"loading", "removed"}),
    "loading": frozenset({"loaded", "failed", "stopping", "removed"}),
    "loaded": frozenset({"reserved", "stopping", "unloaded", "removed"}),
    "reserved": frozenset({"loaded", "stopping", "unloaded", "removed"}),
    "stopping": frozenset({"unloaded", "removed"}),
    "failed": frozenset({"loading", "unloaded", "removed"}),
    "removed": frozenset(),
}
RUNNING = frozenset({"loading", "loaded", "reserved", "stopping"})  # a process that holds a --models-max place
LEAVING = frozenset({"reserved", "stopping"})  # its place is being freed
NEEDS_START = frozenset({"unloaded", "failed"})  # a request for it must start a process


class InvalidTransition(RuntimeError):
    pass


class Lifecycle:
    def __init__(self) -> None:
        self.state = "unloaded"

    def to(self, new: str) -> None:
        """Move to ``new``; InvalidTransition when the table does not allow it."""
        if new not in TRANSITIONS[self.state]:
            raise InvalidTransition(f"{self.state} -> {new}")
        self.state = new
