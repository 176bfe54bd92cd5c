"""Idle sleep (issue 39, item 2; llama-server's --sleep-idle-seconds): a real server
whose model sleeps after 1 s idle. Asleep, /props says is_sleeping, /ready and /health
stay 200, and /metrics serves the figures it had on entering sleep (as llama-server);
the probes do not wake it. The next request wakes it and answers as before, its
conversation restored from the disk tier that going to sleep wrote."""

from __future__ import annotations

import httpx
import pytest
from server_proc import ServerProcess
from waiting import wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    disk = tmp_path_factory.mktemp("prompt-cache")
    flags = ("-np", "1", "-c", "1024", "--metrics", "--cache-ram", "64", "--cache-disk", str(disk))
    with ServerProcess("--sleep-idle-seconds", "1", *flags) as srv:
        srv.wait_ready()
        yield srv


def ask(url: str, messages: list[dict]) -> dict:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(server):
    turn = [{"role": "user", "content": "Tell me a story about a lighthouse keeper and the sea."}]
    first = ask(server.url, turn)
    httpx.get(server.url + "/metrics")  # opens a new throughput window (llama-server's gauges)
    awake = httpx.get(server.url + "/metrics").text
    wait_for(lambda: httpx.get(server.url + "/props").json().get("is_sleeping"), 60, "the model asleep")
    assert httpx.get(server.url + "/ready").status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").text == awake  # the figures it had on entering sleep
    assert httpx.get(server.url + "/props").json()["is_sleeping"]  # the probes above did not wake it
    again = ask(server.url, turn)
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # restored from the disk tier
    props = httpx.get(server.url + "/props").json()
    assert props["is_sleeping"] is False and props["prompt_cache"]["disk"]["hits"] >= 1
