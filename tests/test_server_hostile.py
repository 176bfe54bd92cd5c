"""Hostile and careless clients: huge bodies, huge texts, keys that are not ASCII, and
what the logs may say about users' text."""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest
from checkpoints import make_checkpoint
from server_proc import InProcessServer, ServerProcess

from engine import DEMO_MODEL


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """A tiny random Llama with 8k positions and the demo model's real BPE tokenizer."""
    folder = make_checkpoint(
        tmp_path_factory.mktemp("m") / "ckpt", "llama", vocab_size=4096, max_position_embeddings=8192
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / name, folder / name)
    return folder


def _timed_get(url: str) -> float:
    t0 = time.perf_counter()
    assert httpx.get(url, timeout=30).status_code == 200
    return time.perf_counter() - t0


def test_the_event_loop_never_waits_on_big_work(long_context_model):
    """While a 10 MB prompt is refused, a 4k-token prompt prefills and 1 MB of text is
    tokenized, /health keeps answering: none of that work runs on the event loop. The
    bound that can fail: no tokenizer call runs on the loop's thread (each is recorded
    with its thread), and /health answered at least once while the work went on."""
    settings = {"model": long_context_model, "parallel": 2, "ctx_size": 16384, "ubatch_size": 256}
    with InProcessServer(**settings) as srv:
        tokenizer, threads_seen = srv.state.engine.tokenizer, set()
        for name in ("encode", "decode"):
            real = getattr(tokenizer, name)
            setattr(
                tokenizer,
                name,
                lambda *a, _real=real, **k: (threads_seen.add(threading.current_thread().name), _real(*a, **k))[1],
            )  # noqa: E501
        results: dict[str, httpx.Response] = {}
        text = ("def handler(request):\n    return request.json()  # ünïcode\n" * 20000)[: 1 << 20]

        def call(name, method, path, **kw):
            results[name] = httpx.request(method, srv.url + path, timeout=120, **kw)

        big = {"prompt": "x" * (10 << 20), "max_tokens": 1}
        long_prompt = {"prompt": list(range(5, 4005)), "max_tokens": 4, "temperature": 0}

        def chunked():  # no Content-Length: the limit must count what arrives
            for _ in range(11):
                yield b"x" * (1 << 20)

        calls = [
            ("tokenize", "POST", "/tokenize", {"json": {"content": text}}),
            ("big", "POST", "/v1/completions", {"json": big}),
            ("chunked", "POST", "/v1/completions", {"content": chunked()}),
            ("prefill", "POST", "/v1/completions", {"json": long_prompt}),
        ]
        threads = [threading.Thread(target=call, args=c[:3], kwargs=c[3]) for c in calls]
        for t in threads:
            t.start()
        latencies = []
        while "tokenize" not in results or "prefill" not in results:
            latencies.append(_timed_get(srv.url + "/health"))
        for t in threads:
            t.join(120)
        latencies.sort()
        print(
            f"/health: {len(latencies)} answers, median {latencies[len(latencies) // 2] * 1000:.1f} ms, "
            f"max {latencies[-1] * 1000:.1f} ms"
        )  # docs/benchmarks.md quotes these
        assert latencies  # answered while the work went on
        assert threads_seen and srv.thread.name not in threads_seen, threads_seen  # tokenized off the loop

        for name in ("big", "chunked"):
            r = results[name]
            assert r.status_code == 413, r.text
            assert (
                r.json()["error"]["type"] == "invalid_request_error"
                and "--max-body-size" in r.json()["error"]["message"]
            )
        assert results["prefill"].status_code == 200 and results["prefill"].json()["usage"]["prompt_tokens"] == 4000
        assert results["tokenize"].status_code == 200 and len(results["tokenize"].json()["tokens"]) > 100_000
        too_long = httpx.post(srv.url + "/v1/completions", json={"prompt": "y" * (4 << 20)}, timeout=30)
        assert too_long.status_code == 400  # refused from its length alone, before any tokenization
        assert too_long.json()["error"]["type"] == "exceed_context_size_error"


def test_no_text_or_key_in_the_logs_unless_asked(tmp_path):
    prompt = "def canary_prompt_31337():"
    for flag, shows_text in (("--no-log-prompts", False), ("--log-prompts", True)):
        log = tmp_path / f"{flag}.log"
        with ServerProcess("-np", "1", "--api-key", "key-canary-42", flag, log=log) as srv:
            srv.wait_ready()
            auth = {"Authorization": "Bearer key-canary-42"}
            body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
            done = httpx.post(srv.url + "/v1/completions", json=body, headers=auth)
            assert done.status_code == 200
            completion = done.json()["choices"][0]["text"]
            bad = httpx.post(srv.url + "/v1/completions", json={**body, "max_tokens": -3}, headers=auth)
            assert bad.status_code == 400
            wrong = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong-canary-99"})
            assert wrong.status_code == 401
            odd = httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": "ключ-canary".encode()})
            assert odd.status_code == 401  # a non-ASCII key is refused, never a 500
        text = log.read_text(errors="replace")
        assert "key-canary-42" not in text and "wrong-canary-99" not in text  # keys: never
        assert ("canary_prompt_31337" in text) is shows_text  # text: only with --log-prompts
        assert (repr([completion]) in text) is shows_text
