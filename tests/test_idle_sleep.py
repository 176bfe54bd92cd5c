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
    assert httpx.get(server.url + "/wp-login.php").status_code == 404  # a scanner: no route, no model
    assert httpx.post(server.url + "/v1/chat/completion", json={}).status_code == 404
    assert httpx.get(server.url + "/v1/chat/completions").status_code == 405
    assert httpx.get(server.url + "/props").json()["is_sleeping"]  # none of them woke it
    again = ask(server.url, turn)
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # restored from the disk tier
    props = httpx.get(server.url + "/props").json()
    assert props["is_sleeping"] is False and props["prompt_cache"]["disk"]["hits"] >= 1


def test_the_pages_live_view_and_openapi_do_not_keep_it_awake_or_fail(server):
    """An open web page polls /live: the model still goes to sleep; /openapi.json
    asked while it sleeps is the document (the first time, it wakes the model)."""
    ask(server.url, [{"role": "user", "content": "hi"}])

    def asleep_while_polled() -> bool:
        assert httpx.get(server.url + "/live").status_code == 200
        return httpx.get(server.url + "/props").json().get("is_sleeping")

    wait_for(asleep_while_polled, 60, "the model asleep under a polling page")
    r = httpx.get(server.url + "/openapi.json", timeout=120)
    assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]


def test_a_wake_waits_for_the_engine_thread_that_went_to_sleep():
    """The engine thread still writing its slots when the drain time ran out: the wake
    builds no second engine until it has ended."""
    import asyncio
    import threading

    from server.middleware.idle_sleep import IdleSleep

    ended, loads = threading.Event(), []

    class Engine:
        def health(self):
            return type("H", (), {"n_running": 0, "n_waiting": 0})()

        def cache_stats(self):
            return None

        image_stats = lora_use = cache_stats
        takes_images = False

        def stop(self, timeout):
            ended.wait(timeout if timeout is not None else 10)
            return ended.is_set()

    class State:
        status, sleeping, n_inflight, engine, asleep = "ready", False, 0, Engine(), None
        settings = type("S", (), {"drain_timeout": 0.05})()

        def load_engine(self):
            loads.append(ended.is_set())

    async def scenario():
        sleep = IdleSleep(State(), 0.01)
        sleep.last_active -= 1
        going = asyncio.create_task(sleep.sleep_if_idle())
        while not sleep.state.sleeping:
            await asyncio.sleep(0.01)
        waking = asyncio.create_task(sleep.wake())
        await asyncio.sleep(0.3)  # the drain time is long gone; the thread still runs
        assert loads == []
        ended.set()
        await asyncio.gather(going, waking)

    asyncio.run(scenario())
    assert loads == [True]


def test_a_model_put_to_sleep_leaves_nothing_behind():
    """What requests cached on a model (DRY's vocabulary scans, compiled grammars, token
    bytes, the markers a chat answer keeps) goes with it: once its engine thread has
    stopped, nothing keeps the service, its tokenizer or its weights alive (they were
    kept by class-wide caches keyed by the instance)."""
    import gc
    import weakref

    from engine import DEMO_MODEL, EngineConfig
    from engine.service import EngineService
    from server.pipeline.preserved import preserved
    from server.pipeline.thinking_syntax import THINK

    service = EngineService(EngineConfig(model=str(DEMO_MODEL), n_seq_max=1))
    service.start(None)
    service.dry_breakers(("\n", "```"))
    service.compile_constraint("json_schema", '{"type": "object"}')
    service.tokenizer.token_bytes(7)
    service.tokenizer.breaker_sequences("\n")
    preserved(service.tokenizer, "hermes", THINK)
    assert service.stop(30)
    weights = next(iter(service._engine.model.parameters()))
    alive = [weakref.ref(x) for x in (service, service.tokenizer, service._engine, weights)]
    del service, weights
    gc.collect()
    assert [ref() is None for ref in alive] == [True] * 4


def test_props_asked_as_the_model_goes_to_sleep_says_it_sleeps(monkeypatch):
    """A /props whose memory report is still pending when the model goes to sleep (the
    engine thread stops under it) answers as asleep, not 503: a probe keeps nothing
    awake, and it once counted a 5xx in a suite run."""
    import asyncio

    from server_proc import InProcessServer

    from engine import EngineService

    real = EngineService.memory_report
    with InProcessServer.from_flags("--sleep-idle-seconds", "1", "-np", "1", "-c", "256") as srv:

        async def report_after_sleep_began(self):
            while not srv.state.sleeping:  # the model goes to sleep while this call waits its turn
                await asyncio.sleep(0.01)
            return await real(self)

        monkeypatch.setattr(EngineService, "memory_report", report_after_sleep_began)
        r = httpx.get(srv.url + "/props", timeout=60)
        assert r.status_code == 200 and r.json()["is_sleeping"] is True, r.text
