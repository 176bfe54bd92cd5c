"""The router's child servers: one ``slotserve serve`` process per loaded model, with the
router's shared flags, the model's preset flags and a slot folder under the router's.
A child's state is its Lifecycle (server/router/lifecycle.py), nowhere else.

A child listens on a UNIX socket it binds itself, in a folder only the router's user
can enter (so no other local process can take its address first, or reach it), and
takes requests only with its own secret API key, handed to it in its environment
(never on its command line, which ``ps`` shows); the router puts that key on each
request it relays. Its environment is the router's less the router's own settings
(server/router/handoff.py): a child never starts routing itself.

``--models-max`` is a hard limit, as llama-server's: a request for a model that is not
loaded waits in the load queue (server/router/load_queue.py) until there is room. Room
is made by stopping the least recently used idle model (no request in flight, none
waiting for it). While every loaded model is busy, the queue waits for one to finish,
but not forever: an entry that has waited PATIENCE_S reserves the least recently used
busy model, which then takes no new request (they queue for it in turn), finishes the
ones it has and stops. No request is cut off, and a model kept busy by a steady stream
of clients cannot starve the others. A request that leaves while waiting gives up its
place; a reservation no longer needed is taken back. Stops (unload, reload, making
room, shutdown) give the child ``--drain-timeout`` seconds, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from server.router.child import Child, ClientGone, ModelGone, death_signal
from server.router.entry import ModelEntry
from server.router.handoff import child_env
from server.router.lifecycle import LEAVING, NEEDS_START, RUNNING
from server.router.load_queue import LoadQueue
from server.router.upstream import child_get

log = logging.getLogger("slotserve")
LOAD_TIMEOUT_S = 600.0
PATIENCE_S = 5.0  # how long a queued model waits for an idle one before a busy one is reserved
DEBUG_DELAY_S = float(os.environ.get("SLOTSERVE_ROUTER_DEBUG_DELAY_S", "0"))  # tests: each load and request


class Children:
    def __init__(
        self,
        entries: dict[str, ModelEntry],
        shared_args: list[str],
        models_max: int,
        slots: Path | None,
        drain_s: float = 30.0,
    ):
        self.children = {name: Child(entry) for name, entry in entries.items()}
        self.shared_args, self.models_max, self.slots, self.drain_s = shared_args, models_max, slots, drain_s
        self.queue = LoadQueue()
        self.folder = Path(tempfile.mkdtemp(prefix="slotserve-router-"))  # mode 0700: the sockets' home
        self._n = itertools.count()
        self._changed = asyncio.Event()  # set (and replaced) whenever a child or the queue changes
        self._stops: set[asyncio.Task] = set()
        self.on_gone: Callable[[Child], None] = lambda child: None  # a child's server is gone (its connections)

    def command(self, child: Child) -> list[str]:
        e = child.entry
        cmd = [sys.executable, "-m", "server.cli", "serve", "-m", str(e.path), "--host", child.socket]
        cmd += ["--alias", e.name, "--metrics"]
        if e.mmproj is not None:
            cmd += ["--mmproj", str(e.mmproj)]
        if self.slots is not None:
            cmd += ["--slot-save-path", str(self.slots / e.name)]
        return cmd + self.shared_args + list(e.args)

    def refresh(self) -> None:
        """A child whose server exited since it was last seen: while loading, a load
        failure; while loaded, a crash (it is unloaded, and starts again on use)."""
        for name, child in self.children.items():
            if child.proc is None or child.proc.poll() is None:
                continue
            code = child.proc.returncode
            if child.state == "loading":
                self._failed(child, f"its server exited with code {code} while loading")
            elif child.state in ("loaded", "reserved"):
                log.warning("model %s: its server exited (code %s)", name, code)
                child.crashes += 1
                child.error, child.proc = f"its server exited with code {code}", None
                child.life.to("unloaded")
                self.on_gone(child)
                self._notify()

    def _failed(self, child: Child, why: str) -> None:
        log.error("model %s failed to load: %s", child.entry.name, why)
        child.life.to("failed")
        child.error, child.proc, child.load_failures = why, None, child.load_failures + 1
        self.on_gone(child)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _changes(self, timeout: float = 0.2) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    async def acquire(self, name: str, gone: Callable[[], Awaitable[bool]] | None = None) -> Child:
        """The model's child, loaded, with this request counted in flight (``release`` it).
        Waits in the load queue when the model is not loaded. Raises RuntimeError with
        the load's error when it cannot start, ModelGone when a reload took the model
        away, and ClientGone when ``gone()`` says the client left while waiting."""
        self.refresh()
        child = self.children.get(name)
        if child is None:
            raise ModelGone(f"model '{name}' not found")
        if child.state == "loaded":
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
        entry, failures_seen = self.queue.join(child.entry.name), child.load_failures
        try:
            while True:
                self.refresh()
                if child.state == "removed" or self.children.get(child.entry.name) is not child:
                    raise ModelGone(f"model '{child.entry.name}' was removed from the catalog")
                if child.state == "loaded":
                    child.inflight += 1  # before leaving the queue: busy, so never the next victim
                    return
                if child.state == "failed" and child.load_failures > failures_seen:  # the load it waited for
                    raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")
                if child.state in NEEDS_START and self._head(entry) and self._room():
                    await self._start(child)  # raises when it fails
                    continue
                self.tick()
                if gone is not None and await gone():
                    raise ClientGone("the client left while its model was waiting to load")
                await self._changes()
        finally:
            self.queue.leave(entry)
            self.tick()  # room made for this entry goes to the next one
            self._notify()

    def _needs_room(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.state in NEEDS_START

    def _head(self, entry) -> bool:
        return self.queue.first(self._needs_room) is entry

    def _running(self) -> list[Child]:
        return [c for c in self.children.values() if c.state in RUNNING]

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
            if child.state == "reserved" and child.inflight == 0:
                self._stop_soon(child, "reserved for a queued request, now idle")
        needed = self.queue.needed(self._needs_room)
        free = self.models_max - len(running) + sum(c.state in LEAVING for c in running)
        for child in sorted((c for c in running if c.state == "reserved"), key=lambda c: -c.last_used):
            if free <= needed:
                break
            child.life.to("loaded")  # nobody waits for its room any more
            free -= 1
        while free < needed:
            candidates = [c for c in running if c.state == "loaded" and not self.queue.wants(c.entry.name)]
            idle = [c for c in candidates if c.inflight == 0]
            if idle:
                self._stop_soon(min(idle, key=lambda c: c.last_used), "stopped to make room for a queued request")
            elif candidates and free < self.queue.needed(self._needs_room, waited=PATIENCE_S):
                victim = min(candidates, key=lambda c: c.last_used)
                victim.life.to("reserved")
                log.info("model %s: reserved for a queued request (ends its requests, then stops)", victim.entry.name)
            else:
                return  # every model is busy: the queue waits for a request to end, or for its patience
            free += 1

    def _stop_soon(self, child: Child, why: str) -> None:
        log.info("model %s: %s", child.entry.name, why)
        proc = self._begin_stop(child)
        task = asyncio.get_running_loop().create_task(self._finish_stop(child, proc))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _start(self, child: Child) -> None:
        child.life.to("loading")
        child.error = None
        self._notify()
        if DEBUG_DELAY_S:
            await asyncio.sleep(DEBUG_DELAY_S)
            if child.state != "loading":  # unloaded meanwhile
                return
        child.socket, child.secret = str(self.folder / f"{next(self._n)}.sock"), secrets.token_urlsafe(32)
        cmd = self.command(child)
        log.info("model %s: starting (%s)", child.entry.name, " ".join(cmd[3:]))
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                env=child_env(os.environ, child.secret),
                start_new_session=True,
                preexec_fn=death_signal(),
            )
        except (OSError, subprocess.SubprocessError) as exc:  # no process: nothing holds its place
            self._failed(child, f"its server could not be started: {exc}")
            raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}") from None
        child.proc = proc
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            self.refresh()  # a server that exited: failed
            if child.state != "loading" or child.proc is not proc:  # failed, or unloaded mid-load: its
                return  # waiters see which (a failure is theirs to report; unloaded: they load it again)
            answer = await child_get(child, "/ready", timeout=2)
            if answer is not None and answer.status_code == 200 and child.state == "loading" and child.proc is proc:
                child.life.to("loaded")
                child.loads += 1
                self._notify()
                return
            await asyncio.sleep(0.05)
        self._kill(proc)
        self._failed(child, f"not ready in {LOAD_TIMEOUT_S:.0f} s")
        raise RuntimeError(f"model {child.entry.name} failed to load: {child.error}")

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def _begin_stop(self, child: Child) -> subprocess.Popen | None:
        """SIGTERM (the child drains its requests): ``stopping``."""
        proc = child.proc
        child.life.to("stopping")
        if proc is not None and proc.poll() is None:
            log.info("model %s: stopping", child.entry.name)
            proc.send_signal(signal.SIGTERM)
        self._notify()
        return proc

    async def _finish_stop(self, child: Child, proc: subprocess.Popen | None, drain_s: float | None = None) -> None:
        """Waits for the stopped server, SIGKILL past ``drain_s`` (``--drain-timeout``)."""
        try:
            if proc is not None:
                try:
                    await asyncio.to_thread(proc.wait, self.drain_s if drain_s is None else drain_s)
                except subprocess.TimeoutExpired:
                    log.warning("model %s: not stopped in time, killed", child.entry.name)
                    await asyncio.to_thread(self._kill, proc)
        finally:
            if child.state == "stopping" and child.proc is proc:
                child.proc = None
                child.life.to("unloaded")
                self.on_gone(child)
            self._notify()

    async def _stop(self, child: Child, drain_s: float | None = None) -> None:
        """Stops the child's server and waits until it is gone (one being stopped: waits for it)."""
        if child.state in ("loading", "loaded", "reserved"):
            await self._finish_stop(child, self._begin_stop(child), drain_s)
        while child.state == "stopping":
            await self._changes()

    async def reload(self, entries: dict[str, ModelEntry]) -> None:
        """The catalog read again: a model gone from it, or whose file or flags changed,
        is stopped (and removed when gone: its waiting requests are told); new models
        are added."""
        for name, child in list(self.children.items()):
            new = entries.get(name)
            if new is not None and replace(new, hidden=False) == replace(child.entry, hidden=False):
                child.entry = new
                continue
            if new is None:
                del self.children[name]  # first: no request finds it, no waiter starts it again
            else:
                child.entry, child.error = new, None  # a waiter that starts it meanwhile starts the new one
            while child.state in RUNNING:
                await self._stop(child)
            if new is None:
                child.life.to("removed")
            elif child.state == "failed":
                child.life.to("unloaded")
            self._notify()
        for name, entry in entries.items():
            self.children.setdefault(name, Child(entry))

    async def unload(self, name: str) -> None:
        await self._stop(self.children[name])

    async def stop_all(self, drain_s: float) -> None:
        """At the router's shutdown: every child drains at once, then goes; so does the sockets' folder."""
        try:
            await asyncio.gather(*(self._stop(c, drain_s) for c in self.children.values() if c.state in RUNNING))
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
