"""Prometheus metrics (prometheus-client), one registry per app.

Counters and histograms of a request's end are updated on the engine thread as it ends,
before its slot is released (so "slot idle" implies "counted"); inter-token latency on
the event loop per token; gauges are read at scrape time from the engine, so an
idle server always shows idle values. Names follow the Prometheus naming guide: prefix
``slotserve_``, base units (seconds, bytes), ``_total`` on counters, no request ids,
slot ids or text in labels. docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine import EngineService, RequestEnd
from server.telemetry.llamacpp_metrics import LlamaCppMetrics

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
FILE_TIME = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LENGTHS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
disable_created_metrics()  # no *_created series: dashboards never use them

FINISH_REASONS = ("stop", "length", "abort", "error")
SLOT_FILE_ACTIONS = ("save", "restore", "erase", "delete")


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"slotserve_{name}", doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"slotserve_{name}", doc, buckets=buckets, registry=r)

        self.prompt_tokens_computed = counter("prompt_tokens_computed", "Prompt tokens computed (prefill)")
        self.prompt_tokens_cached = counter(
            "prompt_tokens_cached", "Prompt tokens reused from a slot's cache instead of computed"
        )
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.n_generated = 0
        self.draft_tokens = counter("draft_tokens", "Tokens proposed by speculative decoding (--spec-type)")
        self.draft_tokens_accepted = counter(
            "draft_tokens_accepted", "Proposed tokens the model confirmed (speculative decoding)"
        )
        self.requests = counter("requests", "Requests that ran, by finish reason", ("finish_reason",))
        self.http_errors = counter("http_errors", "HTTP responses with status 4xx or 5xx", ("status_class",))
        self.slot_file_ops = counter("slot_file_operations", "Slot file operations", ("action", "outcome"))
        self.slot_file_written = counter("slot_file_written_bytes", "Bytes of slot files written")
        self.slot_file_read = counter("slot_file_read_bytes", "Bytes of slot files read")
        self.ttft = histogram("time_to_first_token_seconds", "Request arrival to first token", LATENCY)
        self.itl = histogram("inter_token_latency_seconds", "Gap between consecutive tokens", TOKEN_GAP)
        self.e2e = histogram("request_duration_seconds", "Request arrival to its end", LATENCY)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to admission into a slot", LATENCY)
        self.prefill_time = histogram("request_prefill_time_seconds", "Admission to first token", LATENCY)
        self.slot_save_time = histogram("slot_save_duration_seconds", "Slot save, snapshot to fsync", FILE_TIME)
        self.slot_restore_time = histogram("slot_restore_duration_seconds", "Slot restore, read to loaded", FILE_TIME)
        self.prompt_len = histogram("request_prompt_tokens", "Prompt length of a request", LENGTHS)
        self.generation_len = histogram("request_generation_tokens", "Tokens generated for a request", LENGTHS)
        self.cache_config = Info("slotserve_cache_config", "Cache layout and sizes", registry=r)
        self.weight_bytes = Gauge(
            "slotserve_model_weight_bytes", "Resident model weight bytes, by stored type", ("type",), registry=r
        )
        self.llamacpp = LlamaCppMetrics()  # llama-server's families, written after these
        for reason in FINISH_REASONS:
            self.requests.labels(reason)
        for cls in ("4xx", "5xx"):
            self.http_errors.labels(cls)
        for action in SLOT_FILE_ACTIONS:
            for outcome in ("ok", "error"):
                self.slot_file_ops.labels(action, outcome)

    def bind(self, engine_of: Callable[[], EngineService | None], ready: Callable[[], bool]) -> None:
        """Gauges read at scrape time: readiness always; the rest from the engine
        (None while loading: those gauges are absent)."""
        self.registry.register(_LiveCollector(engine_of, ready))

    def describe_cache(self, config: dict[str, str]) -> None:
        self.cache_config.info(config)

    def describe_weights(self, by_type: dict[str, int]) -> None:
        for kind, n in by_type.items():
            self.weight_bytes.labels(kind).set(n)

    def request_ended(self, end: RequestEnd) -> None:
        """One submitted request ended (called on the engine thread before its slot is
        released: prometheus-client's metrics are thread-safe)."""
        self.llamacpp.request_ended(end)
        self.requests.labels(end.outcome).inc()
        self.prompt_len.observe(end.n_prompt)
        self.generation_len.observe(end.n_generated)
        self.generation_tokens.inc(end.n_generated)
        self.n_generated += end.n_generated  # the web page's live view (one writer: the engine thread)
        self.draft_tokens.inc(end.n_drafted)
        self.draft_tokens_accepted.inc(end.n_draft_accepted)
        self.e2e.observe(max(0.0, end.t_end - end.t_arrival))
        if end.t_admit is not None:
            self.prompt_tokens_computed.inc(end.n_prompt - end.n_cached)
            self.prompt_tokens_cached.inc(end.n_cached)
            self.queue_time.observe(max(0.0, end.t_admit - end.t_arrival))
        if end.t_first is not None:
            self.ttft.observe(max(0.0, end.t_first - end.t_arrival))
            if end.t_admit is not None:
                self.prefill_time.observe(max(0.0, end.t_first - end.t_admit))

    def http_status(self, status: int) -> None:
        if status >= 400:
            self.http_errors.labels(f"{status // 100}xx").inc()


class _LiveCollector(Collector):
    def __init__(self, engine_of: Callable[[], EngineService | None], ready: Callable[[], bool]):
        self.engine_of = engine_of
        self.ready = ready

    def describe(self) -> Iterable:
        return []  # dynamic: read at scrape time

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "slotserve_ready", "1 when /ready answers 200 (loaded, not draining), else 0", value=int(self.ready())
        )
        engine = self.engine_of()
        if engine is None:
            return
        health, stats = engine.health(), engine.cache_stats()
        yield from _step_families(health)
        yield from _image_families(engine)
        yield from _slot_families(health, stats)
        yield from _cache_families(stats)
        yield from _prompt_cache_families(stats.prompt_cache)


def _step_families(health) -> Iterable:
    """The engine thread's clock: faults, steps, their wall and CPU time."""
    yield CounterMetricFamily(
        "slotserve_engine_faults", "Engine steps that raised (their requests failed)", value=health.n_faults
    )
    steps = health.steps
    if steps is None:
        return
    yield CounterMetricFamily("slotserve_engine_steps", "Engine steps that completed", value=steps.n)
    wall = "Wall time of the completed engine steps"
    yield CounterMetricFamily("slotserve_engine_step_seconds", wall, value=steps.wall_s)
    decode = "Engine steps of one token per sequence (no prefill chunk)"
    yield CounterMetricFamily("slotserve_engine_decode_steps", decode, value=steps.n_decode)
    yield CounterMetricFamily(
        "slotserve_engine_decode_step_seconds",
        "Wall time of those steps (per step: the inter-token latency floor)",
        value=steps.decode_wall_s,
    )
    yield CounterMetricFamily(
        "slotserve_engine_step_cpu_seconds",
        "Engine thread CPU time in those steps (wall - cpu: waiting for the GIL or preempted)",
        value=steps.cpu_s,
    )


def _image_families(engine) -> Iterable:
    """The image encoder's work (vision-language models: engine/core/media.py)."""
    if not engine.takes_images:
        return
    n, seconds = engine.image_stats()
    yield CounterMetricFamily("slotserve_images_encoded", "Images the vision encoder encoded", value=n)
    yield CounterMetricFamily("slotserve_image_encode_seconds", "Seconds the vision encoder took", value=seconds)


def _slot_families(health, stats) -> Iterable:
    """Requests running and waiting, slots busy and idle."""
    yield GaugeMetricFamily("slotserve_requests_running", "Requests in slots", value=health.n_running)
    yield GaugeMetricFamily("slotserve_requests_waiting", "Requests queued for a slot", value=health.n_waiting)
    yield GaugeMetricFamily("slotserve_slots_busy", "Slots running a request", value=stats.n_slots_busy)
    n_idle = stats.n_slots - stats.n_slots_busy
    yield GaugeMetricFamily("slotserve_slots_idle", "Slots free for a request", value=n_idle)


def _cache_families(stats) -> Iterable:
    """The cache by kind of layer group (one series per group), and checkpoint restores."""
    kind = ["memory_kind"]
    ratio = GaugeMetricFamily(
        "slotserve_kv_cache_usage_ratio", "Share of cache blocks held by running requests (0-1)", labels=kind
    )
    used = GaugeMetricFamily("slotserve_kv_cache_blocks_used", "Cache blocks in use, idle caches included", labels=kind)
    capacity = GaugeMetricFamily("slotserve_kv_cache_blocks_capacity", "Cache blocks in the pool", labels=kind)
    bytes_used = GaugeMetricFamily(
        "slotserve_cache_bytes_used",
        "Bytes of cache in use (KV cells, or recurrent states and their checkpoints)",
        labels=kind,
    )
    bytes_capacity = GaugeMetricFamily("slotserve_cache_bytes_capacity", "Bytes the cache can hold", labels=kind)
    cached = GaugeMetricFamily(
        "slotserve_kv_cache_blocks_cached",
        "Blocks no sequence holds, kept by their tokens' hash for later prompts (unified pool)",
        labels=kind,
    )
    for group in stats.usage.groups:
        cached.add_metric([group.kind], group.n_blocks_cached)
        ratio.add_metric([group.kind], group.n_blocks_held / max(group.n_blocks_total, 1))
        used.add_metric([group.kind], group.n_blocks_used)
        capacity.add_metric([group.kind], group.n_blocks_total)
        bytes_used.add_metric([group.kind], group.bytes_used)
        bytes_capacity.add_metric([group.kind], group.bytes_total)
    yield from (ratio, used, capacity, bytes_used, bytes_capacity, cached)
    yield CounterMetricFamily(
        "slotserve_prefix_cache_tokens",
        "Prompt tokens taken from blocks the unified pool kept by their tokens' hash",
        value=stats.n_pool_tokens,
    )
    yield CounterMetricFamily(
        "slotserve_checkpoint_restores",
        "Prefix reuses that restarted from a kept checkpoint (recurrent or sliding-window caches)",
        value=stats.n_checkpoint_restores,
    )


def _prompt_cache_families(report: dict | None) -> Iterable:
    """The host-RAM prompt cache (--cache-ram): entries, bytes, hits, restores, evictions."""
    if report is None:
        report = dict.fromkeys(("n_entries", "n_bytes", "n_tokens", "hits", "misses", "tokens_restored"), 0)
        report.update(saves=0, evictions=0)
    gauges = {
        "entries": ("Slot states held in the host-RAM prompt cache", "n_entries"),
        "bytes": ("Bytes held in the host-RAM prompt cache", "n_bytes"),
        "tokens": ("Tokens the host-RAM prompt cache's entries hold", "n_tokens"),
    }
    counters = {
        "hits": "Requests that restored a prompt cache entry",
        "misses": "Requests that found no prompt cache entry better than the slots",
        "tokens_restored": "Prompt tokens restored from the prompt cache instead of computed",
        "saves": "Slot states saved into the prompt cache",
        "evictions": "Prompt cache entries dropped for room (least recently used first)",
    }
    yield from _report_families("slotserve_prompt_cache_", report, gauges, counters)
    disk = report.get("disk") or dict.fromkeys(
        ("n_entries", "n_bytes", "writes", "hits", "skipped", "evictions", "dropped"), 0
    )
    gauges = {
        "entries": ("Entries in the disk tier", "n_entries"),
        "bytes": ("Bytes of the disk tier's files", "n_bytes"),
    }
    counters = {
        "writes": "Prompt cache entries written to the disk tier (--cache-disk)",
        "hits": "Disk tier entries restored into a slot",
        "skipped": "Disk tier files skipped: unreadable, corrupt or from another model",
        "evictions": "Disk tier entries removed for room (least recently used first)",
        "dropped": "Prompt cache entries not written to disk (the writer behind, or the write failed)",
    }
    yield from _report_families("slotserve_prompt_cache_disk_", disk, gauges, counters)


def _report_families(prefix: str, report: dict, gauges: dict, counters: dict) -> Iterable:
    """Gauges (name -> (doc, report key)) and counters (name -> doc, the key being the name) of a report."""
    for name, (doc, key) in gauges.items():
        yield GaugeMetricFamily(prefix + name, doc, value=report[key])
    for name, doc in counters.items():
        yield CounterMetricFamily(prefix + name, doc, value=report[name])


class StatusCounter:
    """ASGI middleware: counts responses with a 4xx or 5xx status."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_status(message["status"])
            await send(message)

        return await self.app(scope, receive, counting_send)
