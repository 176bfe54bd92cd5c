"""The model-server protocol that Kubernetes' Gateway API Inference Extension (its
endpoint picker, llm-d's scheduler) routes on, under vLLM's metric names, beside
slotserve's own: the queue, the running requests, the KV cache's use, the cache's
block size and count, and the LoRA adapters in use. Each carries ``model_name`` (the
served model's name), as vLLM's do.

- ``vllm:num_requests_waiting``: requests queued for a slot.
- ``vllm:num_requests_running``: requests in slots.
- ``vllm:kv_cache_usage_perc``: the share (0-1, as vLLM's) of cache blocks running
  requests hold, over every layer group: pool blocks, per-stream blocks of cells, or
  recurrent states.
- ``vllm:cache_config_info`` (1): labels ``block_size`` (tokens a block of the
  attention cache holds) and ``num_gpu_blocks`` (its blocks; the name is vLLM's, the
  blocks are wherever the cache lives).
- ``vllm:lora_requests_info``: when the adapters in use last changed (as seen by the
  scrapes), labels ``max_lora`` (adapters loaded),
  ``running_lora_adapters`` and ``waiting_lora_adapters`` (comma-separated names of the
  adapters running and waiting requests use; a request's ``model`` may name one).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class GatewayCollector(Collector):
    def __init__(self, engine_of: Callable, model_name: Callable[[], str], lora_names: Callable[[], list[str]]):
        self.engine_of, self.model_name, self.lora_names = engine_of, model_name, lora_names
        self._lora: tuple | None = None  # the adapters in use at the last scrape, and since when
        self._lora_since = time.time()

    def describe(self) -> Iterable:
        return []  # read at scrape time

    def collect(self) -> Iterable[GaugeMetricFamily]:
        engine = self.engine_of()
        if engine is None:
            return
        model = [self.model_name()]
        health, stats = engine.health(), engine.cache_stats()

        def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
            extra = labels or {}
            family = GaugeMetricFamily(name, doc, labels=["model_name", *extra])
            family.add_metric([*model, *extra.values()], value)
            return family

        yield gauge("vllm:num_requests_waiting", "Requests waiting for a slot", health.n_waiting)
        yield gauge("vllm:num_requests_running", "Requests running in slots", health.n_running)
        groups = stats.usage.groups
        held, total = sum(g.n_blocks_held for g in groups), sum(g.n_blocks_total for g in groups)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache use, 1 = 100 percent", held / total if total else 0.0)
        attention = next((g for g in groups if g.block_tokens), None)
        if attention is not None:
            config = {"block_size": str(attention.block_tokens), "num_gpu_blocks": str(attention.n_blocks_total)}
            yield gauge("vllm:cache_config_info", "The cache's configuration", 1.0, config)
        names = self.lora_names()
        running, waiting = engine.lora_use()
        lora = {
            "max_lora": str(len(names)),
            "running_lora_adapters": ",".join(names[i] for i in sorted(running) if i < len(names)),
            "waiting_lora_adapters": ",".join(names[i] for i in sorted(waiting) if i < len(names)),
        }
        if (running, waiting) != self._lora:  # the value is when this last changed (vLLM's: its update time)
            self._lora, self._lora_since = (running, waiting), time.time()
        yield gauge("vllm:lora_requests_info", "Running and waiting LoRA adapters", self._lora_since, lora)
