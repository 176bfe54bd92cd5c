"""/metrics of an encoder model (embeddings, rerank): what its queue has done and holds.
A generation model's families (slots, cache, steps) do not apply to it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine import EncoderService


class EncoderCollector(Collector):
    def __init__(self, encoder_of: Callable[[], EncoderService | None]):
        self.encoder_of = encoder_of

    def describe(self) -> Iterable:
        return []  # dynamic: read at scrape time

    def collect(self) -> Iterable:
        encoder = self.encoder_of()
        if encoder is None:
            return
        n_inputs, n_tokens = encoder.counts()
        health = encoder.health()
        yield CounterMetricFamily(
            "slotserve_encoder_inputs", "inputs the encoder has run (embedding inputs, rerank pairs)", value=n_inputs
        )
        yield CounterMetricFamily("slotserve_encoder_tokens", "tokens of those inputs", value=n_tokens)
        yield CounterMetricFamily("slotserve_encoder_rounds", "rounds (batched passes) run", value=health.steps.n)
        yield CounterMetricFamily(
            "slotserve_encoder_seconds", "wall seconds the encoder thread spent in rounds", value=health.steps.wall_s
        )
        yield GaugeMetricFamily(
            "slotserve_encoder_requests_waiting", "requests with inputs not yet run", value=health.n_waiting
        )
        yield GaugeMetricFamily(
            "slotserve_encoder_requests_running", "requests in the round running now", value=health.n_running
        )
