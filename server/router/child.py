"""One model's child server as the router sees it: its process, socket, key, counters and
state (a Lifecycle: server/router/lifecycle.py), and what the router says when a
request cannot have it."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from dataclasses import dataclass, field

from server.router.entry import ModelEntry
from server.router.lifecycle import Lifecycle

PR_SET_PDEATHSIG = 1


class ModelGone(LookupError):
    """The model left the catalog (a reload) while the request waited for it."""


class ClientGone(LookupError):
    """The client left while its model was waiting to load."""


def death_signal():
    """A function for the child between fork and exec that has the kernel send it SIGTERM
    when the router dies (Linux's PR_SET_PDEATHSIG), so no child outlives a killed
    router; None elsewhere. prctl is looked up here, in the parent."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    entry: ModelEntry
    life: Lifecycle = field(default_factory=Lifecycle)
    proc: subprocess.Popen | None = None
    socket: str = ""  # the UNIX socket its server listens on (new for each start)
    secret: str = ""  # its API key (new for each start)
    last_used: float = 0.0
    inflight: int = 0  # requests being proxied to it
    error: str | None = None
    loads: int = 0  # times its server came up (router /metrics)
    load_failures: int = 0
    crashes: int = 0  # times its server exited while loaded

    @property
    def state(self) -> str:
        return self.life.state

    @property
    def url(self) -> str:
        return "http://localhost"  # over its socket
