"""Start-up, readiness, drain on SIGTERM, API keys, settings from flags and env."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from server_proc import ForkedProcess, InProcessServer, ServerProcess
from waiting import wait_for


def data_lines(lines) -> list[str]:
    return [line for line in lines if line.startswith("data: ")]


def test_health_and_ready_while_loading(tmp_path):
    (tmp_path / "load.wait").touch()  # the hook holds the load until the test opens the gate
    with ServerProcess("--metrics", "-np", "1", "-c", "256", hooks=tmp_path) as srv:
        first = srv.wait_listening()  # llama-server's answer while the model loads
        assert first.status_code == 503 and first.json()["error"]["message"] == "Loading model"
        wait_for(lambda: (tmp_path / "loading").exists(), what="loading started")
        ready = httpx.get(srv.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading" and "progress" in ready.json()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        loading = httpx.get(srv.url + "/metrics").text
        assert "slotserve_ready 0.0" in loading and "slotserve_requests_running" not in loading
        (tmp_path / "load.gate").touch()
        srv.wait_ready(120)
        assert httpx.get(srv.url + "/health").status_code == 200
        assert "slotserve_ready 1.0" in httpx.get(srv.url + "/metrics").text
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_sigterm_while_loading_exits_cleanly(tmp_path):
    (tmp_path / "load.wait").touch()
    with ServerProcess("--metrics", "-np", "1", hooks=tmp_path, log=tmp_path / "log") as srv:
        srv.wait_listening()
        wait_for(lambda: (tmp_path / "loading").exists(), what="loading started")
        srv.signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
    assert "Traceback" not in (tmp_path / "log").read_text()


def test_sigterm_drains_in_flight_stream(tmp_path):
    with ServerProcess(
        "--metrics", "-np", "2", "--drain-timeout", "600", log=tmp_path / "log"
    ) as srv:  # a drain that never cuts
        assert isinstance(srv.proc, ForkedProcess)  # from the preloaded interpreter (tests/preloaded.py)
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            srv.signal(signal.SIGTERM)
            ready = wait_for(lambda: (r := httpx.get(srv.url + "/ready")).status_code == 503 and r, what="draining")
            assert ready.json() == {"status": "draining"}
            assert httpx.get(srv.url + "/health").status_code == 200
            refused = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
            rest = data_lines(lines)
        assert rest[-1] == "data: [DONE]"
        assert len(rest) - 1 == 299  # every remaining token arrived: the drain let it finish
        assert srv.proc.wait(30) == 0
    log = (tmp_path / "log").read_text()
    assert "draining (up to 600 s)" in log and "Traceback" not in log


def _cut_drain(tmp_path, second_signal: int | None) -> None:
    """4 streams in flight, SIGTERM with a 0.5 s drain (or a second signal at once):
    every stream ends with an error event and a clean end; the process exits 0."""
    timeout = "0.5" if second_signal is None else "60"
    args = ("-np", "4", "-t", "1", "-c", "512", "--context-shift", "--drain-timeout", timeout)
    with ServerProcess("--metrics", *args, log=tmp_path / "log") as srv:
        srv.wait_ready()
        # context shifts and a limit far away: the streams do not end on their own
        body = {"prompt": "def f():", "max_tokens": 10**9, "ignore_eos": True, "stream": True}
        ends: list[list[str]] = []
        started = threading.Barrier(5)

        def stream():
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                lines = r.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                started.wait(60)
                ends.append(data_lines(lines))  # a broken chunked body would raise here

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait(60)
        srv.signal(signal.SIGTERM)
        if second_signal is not None:  # once the first is seen: two pending SIGTERMs would merge into one
            wait_for(lambda: httpx.get(srv.url + "/ready").status_code == 503, what="draining")
            srv.signal(second_signal)
        for t in threads:
            t.join(60)
        assert srv.proc.wait(30) == 0
    assert len(ends) == 4
    for lines in ends:
        error = json.loads(lines[-1][len("data: ") :])["error"]
        assert error["code"] == 503 and "shutting down" in error["message"]
    log = (tmp_path / "log").read_text()
    assert f"draining (up to {timeout} s)" in log
    assert "Traceback" not in log and "CancelledError" not in log


@pytest.mark.slow
def test_drain_timeout_cuts_long_requests_every_time(tmp_path):
    """4 cut-off drains (2 servers at a time; each stream is still running when the drain
    ends, by construction): exit code 0 every time, never an abort."""
    for i in range(4):
        (tmp_path / str(i)).mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_cut_drain, tmp_path / str(i), None) for i in range(4)]
        for run in runs:
            run.result()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_ends_the_drain_at_once(tmp_path, second):
    _cut_drain(tmp_path, second)


def test_api_keys_flags_and_env(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nfrom-file\n")
    env = {
        "SLOTSERVE_API_KEY": "env-key",
        "SLOTSERVE_PARALLEL": "3",
        "SLOTSERVE_CTX_SIZE": "999",
        "SLOTSERVE_ALIAS": "mine",
    }
    args = ("--api-key", "k1,k2", "--api-key-file", str(key_file), "-c", "512")
    with InProcessServer.from_flags("--metrics", *args, env=env) as srv:
        srv.wait_ready()
        url = srv.url + "/v1/models"
        missing = httpx.get(url)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
        listed = httpx.get(url, headers={"Authorization": "Bearer k2"})
        assert listed.status_code == 200 and listed.json()["data"][0]["id"] == "mine"  # --alias from the env
        assert httpx.get(url, headers={"X-Api-Key": "from-file"}).status_code == 200
        assert httpx.get(url, headers={"X-Api-Key": "# team keys"}).status_code == 401  # a comment line
        assert httpx.get(url, headers={"X-Api-Key": "env-key"}).status_code == 401  # the flag wins over env
        props = httpx.get(srv.url + "/props", headers={"Authorization": "Bearer k1"}).json()
        assert props["total_slots"] == 3  # from the environment
        # the flag's 512 over the env's 999, split between the 3 slots and rounded up to blocks of 16
        assert props["default_generation_settings"]["n_ctx"] == 176
        assert httpx.get(srv.url + "/health").status_code == 200  # probes stay public
        assert httpx.get(srv.url + "/ready").status_code == 200


def test_full_queue_is_503_with_retry_after(tmp_path):
    with InProcessServer.from_flags("--metrics", "-np", "1", "--max-queue", "1") as srv:
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # keep a reference: a collected iterator closes the stream
            next(line for line in lines if line.startswith("data: "))
            short = {"prompt": "x", "max_tokens": 2}
            queued = threading.Thread(target=httpx.post, args=(srv.url + "/v1/completions",), kwargs={"json": short})
            queued.start()  # waits in the queue for the only slot
            wait_for(lambda: "slotserve_requests_waiting 1.0" in httpx.get(srv.url + "/metrics").text, what="queued")
            full = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["type"] == "unavailable_error"
        queued.join(60)


def test_a_bad_flag_value_is_a_clear_startup_error():
    r = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "notaport"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "port" in r.stderr


def test_context_shift_flag(tmp_path):
    body = {"prompt": "def f():", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    with InProcessServer.from_flags("--metrics", "-np", "1", "-c", "256", "--context-shift") as srv:
        srv.wait_ready()
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
        assert r["usage"]["completion_tokens"] == 300 and r["choices"][0]["finish_reason"] == "length"
        slot = httpx.get(srv.url + "/slots").json()[0]
        assert slot["n_cached"] < 256
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"


def test_failure_after_the_first_byte_is_an_sse_error_event():
    """Two streams that together need more KV blocks than the pool holds: the newer one
    fails mid-stream with a final error event; the older one finishes; the server serves on."""
    # one shared pool of 8 + 2 blocks of 16 cells; each stream needs 7
    with InProcessServer.from_flags("--metrics", "-np", "2", "-c", "128", "--kv-unified") as srv:
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 100, "ignore_eos": True, "stream": True}
        results = {}
        first_token = threading.Event()

        def stream(name):
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                lines = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        first_token.set()
                results[name] = (r.status_code, lines)

        threads = [threading.Thread(target=stream, args=(name,)) for name in ("a", "b")]
        threads[0].start()
        assert first_token.wait(60)  # "a" runs before "b" arrives: "b" is the newer one
        threads[1].start()
        for t in threads:
            t.join(60)
        ends = sorted(lines[-1] for _, lines in results.values())
        assert all(status == 200 for status, _ in results.values())
        assert ends[0] == "data: [DONE]"
        error = json.loads(ends[1][6:])["error"]
        assert error["type"] == "unavailable_error" and "full" in error["message"]
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"


def test_a_model_that_cannot_load_is_one_line_and_a_non_zero_exit(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 12)
    for verbose in (False, True):
        log = tmp_path / f"log-{verbose}"
        with ServerProcess("--metrics", "-m", str(bad), *(["--verbose"] if verbose else []), log=log) as srv:
            assert srv.proc.wait(60) == 1
        text = log.read_text()
        errors = [line for line in text.splitlines() if "cannot load the model" in line]
        assert len(errors) == 1 and "not a readable GGUF" in errors[0]
        assert ("Traceback" in text) == verbose


def test_model_load_progress_is_logged_and_drawn_on_a_terminal(tmp_path):
    import io

    from server.telemetry.progress import ProgressLine

    with ServerProcess("--metrics", "-np", "1", log=tmp_path / "log") as srv:
        srv.wait_ready()
    lines = [line for line in (tmp_path / "log").read_text().splitlines() if "loading demo_model:" in line]
    assert lines and lines[-1].endswith("(100%)") and " 38/38 tensors" in lines[-1]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    report = ProgressLine("loading m", screen)
    for i in range(1, 5):
        report(i, 4, i * 100_000_000, 400_000_000)
    drawn = screen.getvalue()
    assert drawn.count("\r") == 4 and drawn.endswith("4/4 tensors, 400 MB of 400 MB (100%)\n")
    assert report.state == {"done": 4, "total": 4, "bytes_done": 400_000_000, "bytes_total": 400_000_000}
