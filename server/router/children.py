"""The router's child servers: one ``slotserve serve`` process per loaded model, on a
loopback port of its own, with the router's shared flags, the model's preset flags and
a slot folder under the router's. States: ``unloaded`` -> ``loading`` -> ``loaded``;
``failed`` when a start fails (the next request tries again); a child that dies is
``unloaded`` again, so the next request for its model starts a new one.

``--models-max``: past it, loading a model first stops the least recently used idle
one (one without requests in flight); when every loaded model is busy, the new one
loads anyway (a stop never cuts a request off)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from server.router.catalog import ModelEntry

log = logging.getLogger("slotserve")
LOAD_TIMEOUT_S = 600.0
PR_SET_PDEATHSIG = 1


def _death_signal():
    """A function for the child between fork and exec that has the kernel send it SIGTERM
    when the router dies (Linux's PR_SET_PDEATHSIG), so no child outlives a killed
    router; None elsewhere. prctl is looked up here, in the parent."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Child:
    entry: ModelEntry
    state: str = "unloaded"  # unloaded | loading | loaded | failed
    proc: subprocess.Popen | None = None
    port: int = 0
    last_used: float = 0.0
    inflight: int = 0  # requests being proxied to it
    error: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Children:
    def __init__(self, entries: dict[str, ModelEntry], shared_args: list[str], models_max: int, slots: Path | None):
        self.children = {name: Child(entry) for name, entry in entries.items()}
        self.shared_args, self.models_max, self.slots = shared_args, models_max, slots
        self._lock = asyncio.Lock()  # starts and stops, one at a time

    def command(self, child: Child) -> list[str]:
        e = child.entry
        cmd = [sys.executable, "-m", "server.cli", "serve", "-m", str(e.path), "--host", "127.0.0.1"]
        cmd += ["--port", str(child.port), "--alias", e.name, "--metrics", "--metrics-public"]
        if e.mmproj is not None:
            cmd += ["--mmproj", str(e.mmproj)]
        if self.slots is not None:
            cmd += ["--slot-save-path", str(self.slots / e.name)]
        return cmd + self.shared_args + list(e.args)

    def refresh(self) -> None:
        """A child that died since it was last seen is unloaded (its model starts again on use)."""
        for name, child in self.children.items():
            if child.state in ("loaded", "loading") and child.proc is not None and child.proc.poll() is not None:
                log.warning("model %s: its server exited (code %s)", name, child.proc.returncode)
                child.state, child.proc = "unloaded", None

    async def ensure(self, name: str) -> Child:
        """The model's child, loaded (started now if need be). Raises RuntimeError with
        the load's error when it cannot start."""
        self.refresh()
        child = self.children[name]
        if child.state != "loaded":
            async with self._lock:
                self.refresh()
                if child.state != "loaded":
                    await self._make_room(child)
                    await self._start(child)
        child.last_used = time.monotonic()
        return child

    async def _make_room(self, wanted: Child) -> None:
        loaded = [c for c in self.children.values() if c.state == "loaded" and c is not wanted]
        while self.models_max and len(loaded) >= self.models_max:
            idle = [c for c in loaded if c.inflight == 0]
            if not idle:
                return  # every loaded model is busy: load past the limit rather than cut a request
            oldest = min(idle, key=lambda c: c.last_used)
            await self._stop(oldest)
            loaded.remove(oldest)

    async def _start(self, child: Child) -> None:
        child.port, child.state, child.error = free_port(), "loading", None
        cmd = self.command(child)
        log.info("model %s: starting (%s)", child.entry.name, " ".join(cmd[3:]))
        child.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_death_signal())
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if child.proc.poll() is not None:
                    child.state, child.error = "failed", f"its server exited with code {child.proc.returncode}"
                    child.proc = None
                    raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")
                try:
                    if (await client.get(child.url + "/ready", timeout=2)).status_code == 200:
                        child.state = "loaded"
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)
        await self._stop(child)
        child.state, child.error = "failed", f"not ready in {LOAD_TIMEOUT_S:.0f} s"
        raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")

    async def _stop(self, child: Child, drain_s: float = 30.0) -> None:
        """SIGTERM (the child drains its requests), then SIGKILL past ``drain_s``."""
        proc, child.proc, child.state = child.proc, None, "unloaded"
        if proc is None or proc.poll() is not None:
            return
        log.info("model %s: stopping", child.entry.name)
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, drain_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)

    async def unload(self, name: str) -> None:
        async with self._lock:
            await self._stop(self.children[name])

    async def load(self, name: str) -> None:
        await self.ensure(name)

    async def stop_all(self, drain_s: float) -> None:
        """At the router's shutdown: every child drains at once, then goes."""
        await asyncio.gather(*(self._stop(c, drain_s) for c in self.children.values() if c.proc is not None))
