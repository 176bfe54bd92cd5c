"""Idle sleep (llama-server's ``--sleep-idle-seconds``): after N seconds without a
request, the model's weights and caches are freed; the next request that needs the model
wakes it (it waits for the reload, as for a first start), and the probes, /props,
/metrics and /v1/models answer meanwhile without waking it (/ready stays 200:
asleep is ready; /props says ``is_sleeping``; /metrics serves the figures the model
had when it went to sleep, as llama-server does).

Going to sleep is the shutdown path of the engine thread: with a disk tier
(``--cache-disk``), the idle slots' states and the RAM tier's entries are written there
first, so the woken model finds its conversations again. One lock orders sleeping and
waking: a request that arrives while the model is going to sleep waits, then wakes it."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from starlette.routing import Match

from server.middleware.paths import rule

log = logging.getLogger("slotserve")


class EngineSnapshot:
    """What /metrics reads of an engine (health, cache statistics, images, adapters in
    use), as it was when the model went to sleep: the same figures while it sleeps."""

    def __init__(self, engine):
        self._health, self._stats = engine.health(), engine.cache_stats()
        self.takes_images, self._images, self._lora = engine.takes_images, engine.image_stats(), engine.lora_use()

    def health(self):
        return self._health

    def cache_stats(self):
        return self._stats

    def image_stats(self):
        return self._images

    def lora_use(self):
        return self._lora


class IdleSleep:
    def __init__(self, state, seconds: float):
        self.state, self.seconds = state, seconds
        self.last_active = time.monotonic()
        self.active = 0  # requests that need the model, from their first byte to their last (WakeOnRequest)
        self._lock = asyncio.Lock()
        self.n_sleeps = 0

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def _idle(self) -> bool:
        state, engine = self.state, self.state.engine
        if state.status != "ready" or state.sleeping or engine is None:
            return False
        health = engine.health()
        if self.active or health.n_running or health.n_waiting or state.n_inflight:
            self.touch()
            return False
        return time.monotonic() - self.last_active >= self.seconds

    async def watch(self) -> None:
        """Put the model to sleep whenever it has been idle ``seconds`` (runs until cancelled)."""
        while True:
            await asyncio.sleep(min(1.0, self.seconds / 4))
            if self._idle():
                await self.sleep_if_idle()

    async def sleep_if_idle(self) -> None:
        """The model sleeps if it is still idle, under the lock that orders sleeping and
        waking (a wake waits until the engine thread has ended)."""
        async with self._lock:
            if self._idle():
                await self._sleep()

    async def _sleep(self) -> None:
        state = self.state
        state.sleeping, engine = True, state.engine
        state.asleep = EngineSnapshot(engine)  # /metrics meanwhile
        state.engine = None  # routes that need the model now wait for wake() (the middleware)
        log.info("idle for %.0f s: the model sleeps (weights and caches freed)", self.seconds)
        if not await asyncio.to_thread(engine.stop, state.settings.drain_timeout):  # the disk tier gets the slots
            log.warning("the engine thread is still writing its slots to disk: waking waits for it")
            await asyncio.to_thread(engine.stop, None)  # a wake (behind the lock) never builds a second engine
        del engine
        gc.collect()
        self.n_sleeps += 1

    async def wake(self) -> None:
        """Load the model again if it sleeps (the callers wait for it)."""
        async with self._lock:
            if not self.state.sleeping:
                return
            log.info("a request wakes the model")
            try:
                await asyncio.to_thread(self.state.load_engine)
            except Exception as exc:  # the files changed under the sleeping server: it cannot serve again
                log.error("the model cannot wake: %s", exc)
                self.state.error, self.state.status = f"the model failed to wake: {exc}", "failed"
            self.state.sleeping, self.state.asleep = False, None
            self.touch()


class WakeOnRequest:
    """ASGI middleware: a request that needs the model (server/middleware/paths.py)
    wakes it first and counts as activity from its first byte to its last, so the
    model never goes to sleep under a request still rendering its template or fetching
    an image; probes, /props, /metrics and the page's /live do neither."""

    def __init__(self, app, sleep: IdleSleep, routes=()):
        """``routes``: the app's routes; a path none of them serves (a 404, a 405) needs
        no model and wakes nothing (a scanner's ``GET /wp-login.php`` would otherwise
        reload the weights)."""
        self.app, self.sleep, self.routes = app, sleep, routes

    def _served(self, scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in self.routes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not rule(scope["path"]).wakes or not self._served(scope):
            return await self.app(scope, receive, send)
        self.sleep.active += 1  # before the wake: the model cannot go to sleep under it (rendering, fetching)
        try:
            self.sleep.touch()
            if self.sleep.state.sleeping:
                await self.sleep.wake()
            await self.app(scope, receive, send)
        finally:
            self.sleep.active -= 1
            self.sleep.touch()
