"""``slotserve serve --models-dir DIR``: the router's process. Its own flags (host,
port, keys, the models' folder and limits: server/router/handoff.py) stay with it; every
other flag goes to each child server, under the model's preset flags. It listens on
every ``--host`` (a path ending in ``.sock``: a UNIX socket), as a model server does.

SIGTERM / SIGINT: the router stops listening, lets the requests in flight finish (up to
``--drain-timeout``), then stops its children (each drains) and exits 0; a second
SIGINT ends it at once."""

from __future__ import annotations

import logging
import signal

import uvicorn

from server.listen import bind
from server.router.app import create_router_app
from server.router.handoff import child_args


class RouterServer(uvicorn.Server):
    def handle_exit(self, sig, frame) -> None:
        """uvicorn's own, less its re-raising of the signal at the end (a drained router exits 0)."""
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def serve_router(settings, argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_router_app(settings, child_args(argv))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    drain = settings.drain_timeout
    hosts = settings.hosts
    config = uvicorn.Config(app, host=hosts[0], port=settings.port, log_level="info", timeout_graceful_shutdown=drain)
    RouterServer(config).run(sockets=bind(hosts, settings.port))
    return 0
