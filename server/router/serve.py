"""``slotserve serve --models-dir DIR``: the router's process. Its own flags (host,
port, keys, the models' folder and limits) stay with it; every other flag goes to each
child server, under the model's preset flags.

SIGTERM / SIGINT: the router stops listening, lets the requests in flight finish (up to
``--drain-timeout``), then stops its children (each drains) and exits 0; a second
SIGINT ends it at once."""

from __future__ import annotations

import logging
import signal

import uvicorn

from server.router.app import create_router_app

ROUTER_ONLY = {  # flag -> whether it takes a value
    "--models-dir": True, "--models-preset": True, "--models-max": True, "--models-autoload": False,
    "--no-models-autoload": False, "--host": True, "--port": True, "-m": True, "--model": True, "-a": True,
    "--alias": True, "--slot-save-path": True, "--api-key": True, "--api-key-file": True, "--metrics": False,
    "--metrics-public": False, "--no-metrics": False,
}  # fmt: skip


def child_args(argv: list[str]) -> list[str]:
    """``argv`` (the router's flags, after ``serve``) less the router's own."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in ROUTER_ONLY:
            i += 1 if "=" in argv[i] or not ROUTER_ONLY[flag] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


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
    config = uvicorn.Config(
        app, host=settings.hosts[0], port=settings.port, log_level="info", timeout_graceful_shutdown=drain
    )
    RouterServer(config).run()
    return 0
