"""The inference gateway's model-server protocol (issue 39, item 3): vLLM's metric names
beside slotserve's own, read with the Prometheus parser from a real server in known
states: idle, one request running and one waiting (a LoRA adapter named by ``model``
in each, as the gateway's LoRA affinity sends them), and idle again."""

from __future__ import annotations

import threading

import httpx
import pytest
from checkpoints import make_adapter, make_checkpoint
from server_proc import ServerProcess
from waiting import wait_for


def gateway(url: str) -> dict[str, tuple[dict, float]]:
    """Every ``vllm:*`` sample: name -> (labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                samples[s.name] = (s.labels, s.value)
    return samples


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway")
    folder = make_checkpoint(root / "m", "llama", max_position_embeddings=4096)
    make_adapter(folder, root / "coder", alpha=8.0)
    make_adapter(folder, root / "writer", alpha=8.0, seed=1)
    flags = ("--metrics", "-np", "1", "-c", "4096", "--lora", f"{root / 'coder'},{root / 'writer'}", "--alias", "m")
    with ServerProcess("-m", str(folder), *flags) as srv:
        srv.wait_ready()
        yield srv


def stream(url: str, body: dict, opened: threading.Event, stop: threading.Event) -> None:
    """A streamed completion held open until ``stop`` (then the client leaves)."""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        for _ in r.iter_lines():
            opened.set()
            if stop.is_set():
                return


def test_the_gateway_reads_the_queue_the_cache_and_the_adapters(server):
    idle = gateway(server.url)
    assert idle["vllm:num_requests_waiting"] == ({"model_name": "m"}, 0.0)
    assert idle["vllm:num_requests_running"][1] == 0.0 and idle["vllm:kv_cache_usage_perc"][1] == 0.0
    config = idle["vllm:cache_config_info"][0]
    memory = httpx.get(server.url + "/props").json()["memory"]["groups"][0]
    assert int(config["block_size"]) == memory["block_size"]
    assert int(config["num_gpu_blocks"]) == memory["n_blocks_total"]
    lora = idle["vllm:lora_requests_info"][0]
    assert lora["max_lora"] == "2" and lora["running_lora_adapters"] == lora["waiting_lora_adapters"] == ""

    stop, threads = threading.Event(), []
    long = {"prompt": "a b c", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}
    for model in ("coder", "writer"):  # one slot: the first runs, the second waits
        opened = threading.Event()
        threads.append(threading.Thread(target=stream, args=(server.url, {**long, "model": model}, opened, stop)))
        threads[-1].start()
        if model == "coder":
            assert opened.wait(60)
    try:
        busy = wait_for(lambda: (g := gateway(server.url))["vllm:num_requests_waiting"][1] == 1 and g, 60, "a queue")
        assert busy["vllm:num_requests_running"][1] == 1
        assert busy["vllm:kv_cache_usage_perc"][1] > 0
        lora = busy["vllm:lora_requests_info"][0]
        assert (lora["running_lora_adapters"], lora["waiting_lora_adapters"]) == ("coder", "writer")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    wait_for(lambda: gateway(server.url)["vllm:num_requests_running"][1] == 0, 60, "idle again")
    after = gateway(server.url)
    assert after["vllm:num_requests_waiting"][1] == 0 and after["vllm:kv_cache_usage_perc"][1] == 0.0


def test_a_model_naming_an_adapter_runs_it(server):
    """``model: "coder"`` answers as ``lora: [{id: 0, scale: 1}]`` does, and not as the
    base model; /v1/models lists each adapter with its parent."""

    def answer(**extra) -> str:
        body = {"prompt": "x y z", "max_tokens": 8, "temperature": 0, **extra}
        return httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

    by_name = answer(model="coder")
    assert by_name == answer(lora=[{"id": 0, "scale": 1.0}])
    assert by_name != answer(model="m", lora=[])  # the base model
    listed = {m["id"]: m.get("parent") for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert listed["coder"] == listed["writer"] == "m"
