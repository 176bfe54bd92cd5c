"""``slotserve serve``: uvicorn with a drain on SIGTERM / SIGINT.

First signal: /ready turns 503 and new requests get 503 while in-flight requests run on
for up to ``--drain-timeout`` seconds; then uvicorn shuts down and the process exits 0.
A second signal exits at once.
"""

from __future__ import annotations

import logging
import time

import uvicorn

from server.app import create_app
from server.settings import ServerSettings
from server.state import ServerState

log = logging.getLogger("slotserve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self._deadline: float | None = None

    def handle_exit(self, sig, frame) -> None:  # called by uvicorn's signal capture
        if self._deadline is not None:
            self.should_exit = self.force_exit = True
            return
        log.info("signal %s: draining (up to %.0f s)", sig, self.drain_timeout)
        self.state.begin_drain()
        self._deadline = time.monotonic() + self.drain_timeout

    async def on_tick(self, counter: int) -> bool:
        if self._deadline is not None and not self.should_exit:
            if self.state.n_inflight == 0:
                self.should_exit = True
            elif time.monotonic() >= self._deadline:
                log.warning("drain timeout: %d requests still running", self.state.n_inflight)
                self.should_exit = self.force_exit = True
        return await super().on_tick(counter)


def serve(settings: ServerSettings) -> int:
    if not settings.kv_unified:
        raise SystemExit("error: --no-kv-unified (per-stream KV cache) is not implemented yet; use --kv-unified")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)  # creates the slot save folder when missing
    except OSError as exc:
        raise SystemExit(f"error: --slot-save-path {settings.slot_save_path}: {exc}") from None
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, timeout_keep_alive=int(settings.timeout), log_level="info"
    )
    server = DrainingServer(config, app.state.slotserve, settings.drain_timeout)
    server.run()
    return 0
