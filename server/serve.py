"""``slotserve serve``: uvicorn with a drain on SIGTERM / SIGINT.

First signal: /ready turns 503 and new requests get 503 while in-flight requests run on
for up to ``--drain-timeout`` seconds. Then (or at a second signal) the requests still
running are cut: streams get a final error event and a clean end of the response,
other requests a 503. uvicorn then closes the connections (waiting up to
``GRACEFUL_S`` for slow clients), the engine thread is stopped at a step boundary and
joined, and the process exits 0. A third signal skips the wait for connections; the
engine thread is still joined. Nothing tensor-related runs while the interpreter exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import time

import uvicorn

from server.app import create_app
from server.config.settings import ServerSettings
from server.listen import bind
from server.state import ServerState

log = logging.getLogger("slotserve")
GRACEFUL_S = 5.0  # after the cut: how long connections get to take their last bytes


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self._deadline: float | None = None
        self._n_signals = 0
        self._cut = False

    def handle_exit(self, sig, frame) -> None:
        """Runs inside a signal handler: set flags only; ``on_tick`` acts on them."""
        self._n_signals += 1
        if self._n_signals == 1:
            log.info("%s: draining (up to %g s)", _signal_name(sig), self.drain_timeout)
            self.state.begin_drain()
            self._deadline = time.monotonic() + self.drain_timeout
        elif self._n_signals == 2:
            log.info("%s again: ending the running requests now", _signal_name(sig))
            self._deadline = time.monotonic()
        else:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._deadline is not None and not self.should_exit:
            if self.state.n_inflight == 0:
                self.should_exit = True
            elif time.monotonic() >= self._deadline and not self._cut:
                log.warning("drain timeout: ending %d running requests", self.state.n_inflight)
                self._cut = True
                self.state.cut_off()
                self.should_exit = True
        return await super().on_tick(counter)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _raise_fd_limit() -> None:
    """Many idle keep-alive connections need descriptors: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def serve(settings: ServerSettings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_fd_limit()
    try:
        app = create_app(settings)  # creates the slot save folder when missing
    except OSError as exc:
        raise SystemExit(f"error: --slot-save-path {settings.slot_save_path}: {exc}") from None
    hosts = settings.hosts
    config = uvicorn.Config(
        app,
        host=hosts[0],
        port=settings.port,
        timeout_keep_alive=int(settings.timeout),
        timeout_graceful_shutdown=GRACEFUL_S,
        log_level="info",
    )
    state: ServerState = app.state.slotserve
    server = DrainingServer(config, state, settings.drain_timeout)
    state.on_failed = lambda: setattr(server, "should_exit", True)  # from the loader thread: a flag only
    unix = [h for h in hosts if h.endswith(".sock")]
    try:
        server.run(sockets=bind(hosts, settings.port) if len(hosts) > 1 or unix else None)
    finally:
        for path in unix:  # the socket files go with the server
            with contextlib.suppress(OSError):
                os.unlink(path)
        if not state.close():
            # A load still in progress (or a stuck step): leave without running
            # interpreter teardown under a thread that is inside torch.
            log.warning("exiting while the model is still loading")
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    return 1 if state.status == "failed" else 0
