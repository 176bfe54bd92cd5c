"""A preloaded interpreter that forks ``slotserve serve`` processes for the tests.

A server process spends ~2.5 s of CPU importing torch, fastapi and the server before it
reads its flags: more than the rest of most tests that start one. This program imports
all of that once, starts no thread, and then forks one child per request: each child is
a real, separate ``slotserve serve`` process (its own pid, signals, log file, exit code,
memory), started from ``server.cli.main`` as the console script starts it, only without
the import. Tests that need the interpreter's own start (the environment read at import,
the console script) start a fresh one instead (``ServerProcess(fresh=True)``).

Run as ``python preloaded.py STATUS_DIR``. Requests come one JSON line at a time on
stdin: ``{"argv": [...], "log": path|null, "hooks": path|null}``; the answer is one
line, ``{"pid": N}`` (or ``{"error": "..."}``). When a child ends, its exit code (negative:
the signal) is written to ``STATUS_DIR/<pid>``. The program ends at its stdin's end.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path


def _preload() -> None:
    """Everything a server imports on its way to serving."""
    import uvicorn.config  # noqa: F401
    import uvicorn.lifespan.on  # noqa: F401
    import uvicorn.protocols.http.h11_impl  # noqa: F401
    import uvicorn.server  # noqa: F401

    import server.app  # noqa: F401 (the routes, the engine, torch)
    import server.cli  # noqa: F401
    import server.serve  # noqa: F401


def _reap(status_dir: Path) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        tmp = status_dir / f".{pid}"
        tmp.write_text(str(os.waitstatus_to_exitcode(status)))
        tmp.rename(status_dir / str(pid))  # whole or absent for the reader


def _child(request: dict) -> int:
    """In the forked child: the request's log as stdout and stderr, then the CLI."""
    log = os.open(request["log"] or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    if request["hooks"]:
        import hooked_serve

        hooked_serve.install(Path(request["hooks"]))
    from server.cli import main

    sys.argv = ["slotserve", *request["argv"]]
    return main(request["argv"])


def _n_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> int:
    status_dir = Path(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, as the CLI sees it
    import numpy  # noqa: F401 (its BLAS starts a thread pool here, one that shuts down across a fork)

    n_threads = _n_threads()
    _preload()  # forking is safe only if this started no thread: no OpenMP pool, no Python thread
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.02)
        _reap(status_dir)
        if not readable:
            continue
        line = sys.stdin.readline()  # one request at a time: the client waits for each answer
        if not line:
            return 0
        if _n_threads() > n_threads:  # (the BLAS pool may have shut down at a fork: fewer)
            print(json.dumps({"error": "the preloaded interpreter runs threads: it cannot fork"}), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            return _child(json.loads(line))  # the child leaves the loop and exits as a process does
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
