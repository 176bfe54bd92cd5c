"""A real ``slotserve serve`` in a subprocess on a free port, for the server tests."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def metric(url: str, name: str, headers: dict | None = None, **labels) -> float:
    """One sample of the server's /metrics, read with the Prometheus parser."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(url + "/metrics", headers=headers).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ForkedProcess:
    """A child of the preloaded interpreter (tests/preloaded.py), with the part of
    ``subprocess.Popen``'s interface the tests use. Its exit code comes from the status
    file the interpreter writes when it reaps the child."""

    def __init__(self, pid: int, status_dir: Path):
        self.pid = pid
        self.returncode: int | None = None
        self._status = status_dir / str(pid)

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked server {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a signal to a reaped pid that may be reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Preloaded:
    """The preloaded interpreter of this test process, started on first use and ended
    with it (its stdin's end)."""

    def __init__(self) -> None:
        self.status_dir = Path(tempfile.mkdtemp(prefix="slotserve-forks-"))
        program = Path(__file__).with_name("preloaded.py")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(program), str(self.status_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lock = threading.Lock()  # one request and its answer at a time
        atexit.register(self.close)

    def close(self) -> None:
        """End the interpreter (its stdin's end) and remove its status folder."""
        self.proc.stdin.close()
        self.proc.wait(30)
        shutil.rmtree(self.status_dir, ignore_errors=True)

    def fork(self, argv: list[str], log: Path | None, hooks: Path | None) -> ForkedProcess | None:
        """A server child running ``slotserve ARGV``; None when the interpreter cannot fork."""
        request = {"argv": argv, "log": str(log) if log else None, "hooks": str(hooks) if hooks else None}
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = json.loads(self.proc.stdout.readline() or '{"error": "the preloaded interpreter ended"}')
        return ForkedProcess(answer["pid"], self.status_dir) if "pid" in answer else None


@functools.cache
def preloaded() -> Preloaded:
    return Preloaded()


class ServerProcess:
    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        hooks: Path | None = None,
        fresh: bool = False,
    ):
        """``slotserve serve ARGS`` in a process of its own, on a free port. It is forked
        from the preloaded interpreter (tests/preloaded.py: the imports are done once),
        unless ``fresh`` or ``env`` is given (the environment is read at import, too):
        then a new interpreter starts it as the console script does. ``hooks``: a
        control folder; the server then runs with the test hooks of
        tests/hooked_serve.py, steered through files in that folder."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        argv = ["serve", "--port", str(self.port), *args]
        forked = None if fresh or env is not None else preloaded().fork(argv, log, hooks)
        if forked is not None:
            self.proc = forked
            return
        launcher = (
            ["-m", "server.cli"] if hooks is None else [str(Path(__file__).with_name("hooked_serve.py")), str(hooks)]
        )
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, *launcher, *argv], stdout=out, stderr=subprocess.STDOUT, env=full_env
        )

    def wait_listening(self, timeout: float = 60) -> httpx.Response:
        """Poll /health until the listener answers; returns that first answer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                return httpx.get(self.url + "/health", timeout=1)
            except httpx.TransportError:
                time.sleep(0.02)
        raise TimeoutError("server did not start listening")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise TimeoutError("server did not become ready")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class InProcessServer:
    """A real uvicorn server on a free port, in a thread of the test process, so a test
    can monkeypatch the engine, the memory or the disk to inject faults. ``settings``:
    ServerSettings fields (llama-server flag names as field names)."""

    def __init__(self, **settings):
        import threading

        import uvicorn

        from server.app import create_app
        from server.config.settings import ServerSettings

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(ServerSettings(port=self.port, **settings))
        self.state = self.app.state.slotserve
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    @classmethod
    def from_flags(cls, *args: str, env: dict[str, str] | None = None, log: Path | None = None) -> InProcessServer:
        """The server ``slotserve serve ARGS`` starts, in this process: the flags go
        through the real command line, ``env`` is the environment while the settings
        are read (once, at start: nothing reads it later). Cheaper than a ServerProcess
        by the interpreter's start and imports (~4 s), for tests that need no process of
        their own (no signal, exit code, log file or resident memory). ``log``:
        ServerProcess's parameter, unused (the lines go to this process's logging)."""
        import argparse

        from server.config.flags import add_flags, settings_from_args

        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            parser = argparse.ArgumentParser()
            add_flags(parser)
            settings = settings_from_args(parser.parse_args(list(args)))
            return cls(**{name: getattr(settings, name) for name in settings.model_fields_set if name != "port"})
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def wait_ready(self) -> None:
        """Ready since ``__enter__`` (ServerProcess's call, kept for the same test code)."""

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + self.state.settings.api_prefix + "/ready", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.state.status == "failed":
                raise RuntimeError(self.state.error)
            time.sleep(0.02)
        raise TimeoutError("in-process server did not become ready")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)
