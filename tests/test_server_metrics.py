"""/metrics of a real server, parsed with prometheus_client's parser: after a known
workload the counters moved by exactly what was served, histograms counted every
request, gauges are back at idle, and every name follows the conventions."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import InProcessServer
from waiting import wait_for

N_SLOTS = 4
KEY = {"Authorization": "Bearer sesame"}
FORBIDDEN_LABELS = {"id", "id_slot", "slot", "request_id", "id_task", "prompt", "text", "filename"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("metrics")
    args = ("-np", str(N_SLOTS), "--api-key", "sesame", "--metrics-public", "--slot-save-path", str(d / "slots"))
    with InProcessServer.from_flags("--metrics", *args, log=d / "server.log") as srv:
        srv.wait_ready()
        yield srv


def scrape(srv) -> tuple[dict, dict]:
    """(samples by (name, sorted labels), families by name)."""
    r = httpx.get(srv.url + "/metrics")  # public: no key
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    return samples, families


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: dict, before: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def wait_idle(srv) -> None:
    wait_for(lambda: not any(s["is_processing"] for s in httpx.get(srv.url + "/slots", headers=KEY).json()))


def test_counters_histograms_and_gauges_after_a_known_workload(server):
    # a stream the client abandons: counted as abort (its token count is the server's business)
    body = {"prompt": "abandon", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=KEY, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
    wait_idle(server)  # a request's end is counted before its slot is released: no wait beyond idle
    assert value(scrape(server)[0], "slotserve_requests_total", finish_reason="abort") >= 1

    before, _ = scrape(server)
    usages = []
    for i, n in enumerate((8, 12, 16)):
        body = {"prompt": f"Request number {i} asks for some text", "max_tokens": n, "ignore_eos": True}
        usages.append(httpx.post(server.url + "/v1/completions", json=body, headers=KEY, timeout=60).json()["usage"])
    body = {"prompt": "Request number 0 asks for some text", "max_tokens": 5, "ignore_eos": True}  # prefix reuse
    usages.append(httpx.post(server.url + "/v1/completions", json=body, headers=KEY, timeout=60).json()["usage"])
    chat = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 10,
        "ignore_eos": True,  # sampled without a seed: an early EOS would make the counts random
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat, headers=KEY, timeout=60) as r:
        import json

        frames = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    usages.append(frames[-1]["usage"])
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": -1}, headers=KEY)
    unauthorized = httpx.get(server.url + "/v1/models")
    assert bad.status_code == 400 and unauthorized.status_code == 401
    wait_idle(server)
    after, families = scrape(server)

    n_req = len(usages)
    n_prompt = sum(u["prompt_tokens"] for u in usages)
    n_cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    n_gen = sum(u["completion_tokens"] for u in usages)
    assert n_cached > 0
    assert delta(after, before, "slotserve_prompt_tokens_cached_total") == n_cached
    assert delta(after, before, "slotserve_prompt_tokens_computed_total") == n_prompt - n_cached
    assert delta(after, before, "slotserve_generation_tokens_total") == n_gen == 8 + 12 + 16 + 5 + 10
    assert delta(after, before, "slotserve_requests_total", finish_reason="length") == n_req
    for reason in ("stop", "abort", "error"):
        assert delta(after, before, "slotserve_requests_total", finish_reason=reason) == 0
    assert delta(after, before, "slotserve_http_errors_total", status_class="4xx") == 2
    assert delta(after, before, "slotserve_http_errors_total", status_class="5xx") == 0
    for name in (
        "slotserve_time_to_first_token_seconds",
        "slotserve_request_duration_seconds",
        "slotserve_request_queue_time_seconds",
        "slotserve_request_prefill_time_seconds",
        "slotserve_request_prompt_tokens",
        "slotserve_request_generation_tokens",
    ):
        assert delta(after, before, name + "_count") == n_req, name
        assert delta(after, before, name + "_bucket", le="+Inf") == n_req, name
    assert delta(after, before, "slotserve_request_prompt_tokens_sum") == n_prompt
    assert delta(after, before, "slotserve_request_generation_tokens_sum") == n_gen
    assert delta(after, before, "slotserve_inter_token_latency_seconds_count") == n_gen - n_req
    n_steps = delta(after, before, "slotserve_engine_steps_total")
    assert 16 <= n_steps <= n_prompt + n_gen  # the 16-token request alone takes 16 forwards
    wall = delta(after, before, "slotserve_engine_step_seconds_total")
    cpu = delta(after, before, "slotserve_engine_step_cpu_seconds_total")
    assert 0 < cpu <= wall + 0.01  # the engine thread's CPU time inside the steps' wall time
    n_decode = delta(after, before, "slotserve_engine_decode_steps_total")
    assert 11 <= n_decode < n_steps  # the 16-token request decoded alone at least 11 steps
    assert 0 < delta(after, before, "slotserve_engine_decode_step_seconds_total") < wall

    assert value(after, "slotserve_requests_running") == 0
    assert value(after, "slotserve_requests_waiting") == 0
    assert value(after, "slotserve_slots_busy") == 0
    assert value(after, "slotserve_slots_idle") == N_SLOTS
    kind = dict(families["slotserve_kv_cache_usage_ratio"].samples[0].labels)["memory_kind"]
    used = value(after, "slotserve_kv_cache_blocks_used", memory_kind=kind)
    total = value(after, "slotserve_kv_cache_blocks_capacity", memory_kind=kind)
    assert 0 < used <= total  # idle slots keep their caches for reuse...
    assert value(after, "slotserve_kv_cache_usage_ratio", memory_kind=kind) == 0  # ...but no request holds any
    assert value(after, "slotserve_ready") == 1
    info = families["slotserve_cache_config_info"].samples[0].labels
    assert info["slots"] == str(N_SLOTS) and info["block_size"] == "16" and info["layout"] == "stream"
    assert int(info["num_blocks"]) == total


def test_gauges_while_busy(server):
    body = {"prompt": "busy", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=KEY, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        samples, _ = scrape(server)
        assert value(samples, "slotserve_requests_running") == 1
        assert value(samples, "slotserve_slots_busy") == 1 and value(samples, "slotserve_slots_idle") == N_SLOTS - 1
        kind = next(k for (n, k) in samples if n == "slotserve_kv_cache_usage_ratio")
        ratio = samples[("slotserve_kv_cache_usage_ratio", kind)]
        total = samples[("slotserve_kv_cache_blocks_capacity", kind)]
        assert ratio * total >= 1  # the running request's blocks (prompt + tokens so far)
    wait_idle(server)


def test_slot_file_metrics(server):
    before, _ = scrape(server)
    saved = httpx.post(server.url + "/slots/0?action=save", json={"filename": "m.slot"}, headers=KEY).json()
    restored = httpx.post(server.url + "/slots/1?action=restore", json={"filename": "m.slot"}, headers=KEY).json()
    missing = httpx.post(server.url + "/slots/1?action=restore", json={"filename": "none"}, headers=KEY)
    assert missing.status_code == 404
    after, _ = scrape(server)
    ops = "slotserve_slot_file_operations_total"
    assert delta(after, before, ops, action="save", outcome="ok") == 1
    assert delta(after, before, ops, action="restore", outcome="ok") == 1
    assert delta(after, before, ops, action="restore", outcome="error") == 1
    assert delta(after, before, "slotserve_slot_file_written_bytes_total") == saved["n_written"]
    assert delta(after, before, "slotserve_slot_file_read_bytes_total") == restored["n_read"]
    assert delta(after, before, "slotserve_slot_save_duration_seconds_count") == 1
    assert delta(after, before, "slotserve_slot_restore_duration_seconds_count") == 1


def test_every_name_follows_the_conventions(server):
    _, families = scrape(server)
    assert len(families) >= 25
    for name, family in families.items():
        if name.startswith(("llamacpp:", "vllm:")):  # llama-server's and vLLM's names, as they write them
            continue  # (tested against their writers below and in tests/test_gateway_metrics.py)
        assert re.fullmatch(r"slotserve_[a-z0-9_]+", name), name
        assert family.documentation, name
        assert not re.search(r"_(ms|milliseconds|minutes|kb|mb|percent)(_|$)", name), name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), name
        else:
            assert not name.endswith("_total"), name
        if family.type == "histogram" and ("time" in name or "latency" in name or "duration" in name):
            assert name.endswith("_seconds"), name
        if name.endswith("_ratio"):
            assert all(0 <= s.value <= 1 for s in family.samples), name
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample.name
            assert not FORBIDDEN_LABELS & set(sample.labels), sample


def test_metrics_follow_the_api_key_unless_public(tmp_path):
    with InProcessServer.from_flags("--metrics", "-np", "1", "--api-key", "sesame") as srv:
        srv.wait_ready()
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/metrics", headers=KEY).status_code == 200
    with InProcessServer.from_flags("-np", "1", "--no-metrics") as srv:
        srv.wait_ready()
        r = httpx.get(srv.url + "/metrics")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"  # as llama-server
