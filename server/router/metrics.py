"""The router's ``/metrics``: its own families (each model's state, its queued and
in-flight requests, its loads) and every loaded child's, joined, each sample labelled
with its ``model``. A model that is not loaded has no child to scrape; its state and
counters here still say what became of it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from server.router.child import Child
from server.router.children import Children
from server.router.upstream import child_get

STATES = ("unloaded", "loading", "loaded", "unloading", "failed", "sleeping")  # as /models lists them


class _RouterCollector:
    def __init__(self, children: Children, states: dict[str, str]):
        self.children, self.states = children, states

    def collect(self):
        state = GaugeMetricFamily(
            "slotserve_router_model_state", "1 for the state each model is in", labels=["model", "state"]
        )
        queued = GaugeMetricFamily(
            "slotserve_router_requests_queued", "requests waiting for the model to load", labels=["model"]
        )
        running = GaugeMetricFamily(
            "slotserve_router_requests_in_flight", "requests being proxied to the model", labels=["model"]
        )
        loads = CounterMetricFamily(
            "slotserve_router_model_loads", "times the model's server came up", labels=["model"]
        )
        failed = CounterMetricFamily(
            "slotserve_router_model_load_failures", "times the model's server failed to come up", labels=["model"]
        )
        crashed = CounterMetricFamily(
            "slotserve_router_model_crashes", "times the model's server exited while loaded", labels=["model"]
        )
        waiting = {e.name: e.waiters for e in self.children.queue.entries}
        for name, child in self.children.children.items():
            for s in STATES:
                state.add_metric([name, s], float(self.states.get(name) == s))
            queued.add_metric([name], waiting.get(name, 0))
            running.add_metric([name], child.inflight)
            loads.add_metric([name], child.loads)
            failed.add_metric([name], child.load_failures)
            crashed.add_metric([name], child.crashes)
        yield from (state, queued, running, loads, failed, crashed)


def router_families(children: Children, states: dict[str, str]) -> str:
    """The router's own families in Prometheus' text format (``states``: each model's, as listed)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RouterCollector(children, states))
    return generate_latest(registry).decode()


async def scrape(child: Child) -> str:
    answer = await child_get(child, "/metrics", timeout=10)
    return answer.text if answer is not None and answer.status_code == 200 else ""


async def props_of(child: Child) -> dict:
    answer = await child_get(child, "/props", timeout=2)
    try:
        return answer.json() if answer is not None and answer.status_code == 200 else {}
    except ValueError:
        return {}


def joined(texts: dict[str, str]) -> str:
    """The children's Prometheus texts as one, each sample labelled with its ``model``."""
    families: dict[str, tuple[str, str, list[str]]] = {}  # name -> (type, help, sample lines)
    for model, text in texts.items():
        for family in text_string_to_metric_families(text):
            kind, doc, lines = families.setdefault(family.name, (family.type, family.documentation, []))
            for s in family.samples:
                labels = {"model": model, **s.labels}
                rendered = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
                lines.append(f"{s.name}{{{rendered}}} {s.value}")
    out = []
    for name, (kind, doc, lines) in families.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
