"""The router's child servers: one ``slotserve serve`` process per loaded model, on a
loopback port of its own, with the router's shared flags, the model's preset flags and
a slot folder under the router's. States: ``unloaded`` -> ``loading`` -> ``loaded``;
``failed`` when a start fails (the next request tries again); a child that dies is
``unloaded`` again, so the next request for its model starts a new one.

``--models-max`` is a hard limit, as llama-server's: a request for a model that is not
loaded waits in the load queue (server/router/load_queue.py) until there is room. Room
is made by stopping the least recently used idle model (no request in flight, none
waiting for it). While every loaded model is busy, the queue waits for one to finish,
but not forever: an entry that has waited PATIENCE_S reserves the least recently used
busy model, which then takes no new request (they queue for it in turn), finishes the
ones it has and stops. No request is cut off, and a model kept busy by a steady stream
of clients cannot starve the others. A request that leaves while waiting gives up its
place; a reservation no longer needed is taken back.
"""

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from server.router.entry import ModelEntry
from server.router.load_queue import LoadQueue

log = logging.getLogger("slotserve")
LOAD_TIMEOUT_S = 600.0
PATIENCE_S = 5.0  # how long a queued model waits for an idle one before a busy one is reserved
DEBUG_DELAY_S = float(os.environ.get("SLOTSERVE_ROUTER_DEBUG_DELAY_S", "0"))  # tests: each load and request
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
    stopping: bool = False  # SIGTERM sent: it drains, takes nothing new
    reserved: bool = False  # picked to make room while busy: takes nothing new, stops when idle
    loads: int = 0  # times its server came up (router /metrics)
    load_failures: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Children:
    def __init__(self, entries: dict[str, ModelEntry], shared_args: list[str], models_max: int, slots: Path | None):
        self.children = {name: Child(entry) for name, entry in entries.items()}
        self.shared_args, self.models_max, self.slots = shared_args, models_max, slots
        self.queue = LoadQueue()
        self._changed = asyncio.Event()  # set (and replaced) whenever a child or the queue changes
        self._stops: set[asyncio.Task] = set()

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
                self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _changes(self, timeout: float = 0.2) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    def ready(self, child: Child) -> bool:
        return child.state == "loaded" and not child.stopping and not child.reserved

    async def acquire(self, name: str, gone: Callable[[], Awaitable[bool]] | None = None) -> Child:
        """The model's child, loaded, with this request counted in flight (``release`` it).
        Waits in the load queue when the model is not loaded. Raises RuntimeError with
        the load's error when it cannot start, and LookupError when ``gone()`` says the
        client left while waiting."""
        self.refresh()
        child = self.children[name]
        if self.ready(child):
            child.inflight += 1
        else:
            await self._wait_loaded(child, gone)
        child.last_used = time.monotonic()
        return child

    def release(self, child: Child) -> None:
        child.inflight -= 1
        child.last_used = time.monotonic()
        self.tick()
        self._notify()

    async def _wait_loaded(self, child: Child, gone) -> None:
        entry, saw_loading = self.queue.join(child.entry.name), False
        try:
            while True:
                self.refresh()
                if self.ready(child):
                    child.inflight += 1  # before leaving the queue: busy, so never the next victim
                    return
                if child.state == "loading":
                    saw_loading = True
                elif saw_loading and child.state == "failed":  # the load another waiter started fell over
                    raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")
                if child.state in ("unloaded", "failed"):  # (again: it stopped or died before we woke)
                    saw_loading = entry.loading = False
                    if self._head(entry) and self._room():
                        entry.loading = True  # kept once loaded: its model has its room until the waiters leave
                        try:
                            await self._start(child)
                        except BaseException:
                            entry.loading = False
                            raise
                        continue
                self.tick()
                if gone is not None and await gone():
                    raise LookupError("the client left while its model was waiting to load")
                await self._changes()
        finally:
            self.queue.leave(entry)
            self.tick()  # room made for this entry goes to the next one
            self._notify()

    def _head(self, entry) -> bool:
        return self.queue.first() is entry and not entry.loading

    def _running(self) -> list[Child]:
        return [c for c in self.children.values() if c.state in ("loading", "loaded")]

    def _room(self) -> bool:
        return self.models_max <= 0 or len(self._running()) < self.models_max

    def tick(self) -> None:
        """Makes room for the queue: while it needs more than is free or being freed,
        stops idle models, least recently used first, and once an entry has waited
        PATIENCE_S reserves busy ones; takes reservations back when no longer needed.
        Never waits: the stops run on their own."""
        if self.models_max <= 0:
            return
        running = self._running()
        for child in running:
            if child.reserved and child.inflight == 0 and not child.stopping:
                self._stop_soon(child, "reserved for a queued request, now idle")
        free = self.models_max - len(running) + sum(c.stopping or c.reserved for c in running)
        for child in sorted((c for c in running if c.reserved and not c.stopping), key=lambda c: -c.last_used):
            if free <= self.queue.needed():
                break
            child.reserved, free = False, free - 1  # nobody waits for its room any more
        while free < self.queue.needed():
            candidates = [
                c
                for c in running
                if c.state == "loaded" and not (c.stopping or c.reserved or self.queue.wants(c.entry.name))
            ]
            idle = [c for c in candidates if c.inflight == 0]
            if idle:
                self._stop_soon(min(idle, key=lambda c: c.last_used), "stopped to make room for a queued request")
            elif candidates and free < self.queue.needed(waited=PATIENCE_S):
                victim = min(candidates, key=lambda c: c.last_used)
                victim.reserved = True
                log.info("model %s: reserved for a queued request (ends its requests, then stops)", victim.entry.name)
            else:
                return  # every model is busy: the queue waits for a request to end, or for its patience
            free += 1

    def _stop_soon(self, child: Child, why: str) -> None:
        log.info("model %s: %s", child.entry.name, why)
        child.stopping = True
        task = asyncio.get_running_loop().create_task(self._stop(child))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _start(self, child: Child) -> None:
        child.state, child.error = "loading", None
        if DEBUG_DELAY_S:
            await asyncio.sleep(DEBUG_DELAY_S)
            if child.state != "loading":  # unloaded meanwhile
                return
        child.port = free_port()
        cmd = self.command(child)
        log.info("model %s: starting (%s)", child.entry.name, " ".join(cmd[3:]))
        proc = child.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_death_signal()
        )
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if child.stopping or child.proc is not proc:  # unloaded while loading: not a failure;
                    return  # its waiters see it unloaded and load it again
                if proc.poll() is not None:
                    child.state, child.error = "failed", f"its server exited with code {proc.returncode}"
                    child.proc, child.load_failures = None, child.load_failures + 1
                    self._notify()
                    raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")
                try:
                    ok = (await client.get(child.url + "/ready", timeout=2)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok and not child.stopping and child.proc is proc:
                    child.state, child.loads = "loaded", child.loads + 1
                    self._notify()
                    return
                await asyncio.sleep(0.05)
        await self._stop(child)
        child.state, child.error = "failed", f"not ready in {LOAD_TIMEOUT_S:.0f} s"
        child.load_failures += 1
        raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")

    async def _stop(self, child: Child, drain_s: float = 30.0) -> None:
        """SIGTERM (the child drains its requests), then SIGKILL past ``drain_s``."""
        proc, child.stopping = child.proc, True
        try:
            if proc is not None and proc.poll() is None:
                log.info("model %s: stopping", child.entry.name)
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(proc.wait, drain_s)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await asyncio.to_thread(proc.wait)
        finally:
            if child.proc is proc:
                child.state, child.proc = "unloaded", None
            child.stopping = child.reserved = False
            self._notify()

    async def reload(self, entries: dict[str, ModelEntry]) -> None:
        """The catalog read again: a model gone from it, or whose file or flags changed,
        is stopped (and forgotten when gone); new models are added."""
        for name, child in list(self.children.items()):
            new = entries.get(name)
            if new is not None and replace(new, hidden=False) == replace(child.entry, hidden=False):
                child.entry = new
                continue
            if child.proc is not None:
                await self._stop(child)
            if new is None:
                del self.children[name]
            else:
                child.entry, child.state, child.error = new, "unloaded", None
        for name, entry in entries.items():
            self.children.setdefault(name, Child(entry))

    async def unload(self, name: str) -> None:
        await self._stop(self.children[name])

    async def stop_all(self, drain_s: float) -> None:
        """At the router's shutdown: every child drains at once, then goes."""
        await asyncio.gather(*(self._stop(c, drain_s) for c in self.children.values() if c.proc is not None))
