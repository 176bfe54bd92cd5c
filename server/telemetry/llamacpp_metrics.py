"""llama-server's ``/metrics`` families (``llamacpp:*``), written after slotserve's own
so that dashboards built on llama-server work unchanged: the names, help texts, types
and number format of its server-task.cpp (llama-cpp-python 0.3.36's llama.cpp), plus
the two cache gauges older llama-servers wrote (``kv_cache_usage_ratio``,
``kv_cache_tokens``).

Rendered by hand, not through prometheus-client: llama-server declares counters whose
names do not end in ``_total`` (``n_tokens_max``), which prometheus-client would rename.
As in llama-server, the two throughput gauges cover the time since the previous scrape
(each scrape starts a new window).
"""

from __future__ import annotations

import threading

from engine import RequestEnd

COUNTERS = {  # name -> help, as llama-server writes them
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    "n_tokens_max": "Largest observed sequence length (prompt + generation)",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": "Speculative: Total draft tokens accepted by the target model",
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
}
GAUGES = {
    "prompt_tokens_seconds": "Average prompt throughput in tokens/s",
    "predicted_tokens_seconds": "Average generation throughput in tokens/s",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "n_busy_slots_per_decode": "Average number of busy slots per llama_decode() call",
    "kv_cache_usage_ratio": "KV-cache usage. 1 = 100 percent usage.",
    "kv_cache_tokens": "KV-cache tokens.",
}


class LlamaCppMetrics:
    """Totals of ended requests (told on the engine thread) and the engine's live
    state, rendered on demand (on the event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(COUNTERS, 0.0)
        self._window = [0.0, 0.0, 0.0, 0.0]  # prompt tokens, prompt seconds, predicted tokens, predicted seconds

    def request_ended(self, end: RequestEnd) -> None:
        prompt_s = end.t_first - end.t_admit if end.t_first is not None and end.t_admit is not None else 0.0
        predict_s = end.t_end - end.t_first if end.t_first is not None else 0.0
        n_computed = end.n_prompt - end.n_cached if end.t_admit is not None else 0
        with self._lock:
            t = self._totals
            t["prompt_tokens_total"] += n_computed
            t["prompt_tokens_cached_total"] += end.n_cached if end.t_admit is not None else 0
            t["prompt_seconds_total"] += max(0.0, prompt_s)
            t["tokens_predicted_total"] += end.n_generated
            t["tokens_predicted_seconds_total"] += max(0.0, predict_s)
            t["n_tokens_max"] = max(t["n_tokens_max"], end.n_prompt + end.n_generated)
            t["spec_decode_num_draft_tokens_total"] += end.n_drafted
            t["spec_decode_num_accepted_tokens_total"] += end.n_draft_accepted
            t["spec_decode_num_drafts_total"] += end.n_drafts
            w = self._window
            w[0], w[1] = w[0] + n_computed, w[1] + max(0.0, prompt_s)
            w[2], w[3] = w[2] + end.n_generated, w[3] + max(0.0, predict_s)

    def render(self, health, stats) -> str:
        """The families as llama-server writes them (``health``/``stats``: the engine
        service's); starts a new throughput window."""
        with self._lock:
            counters = dict(self._totals)
            window, self._window = self._window, [0.0, 0.0, 0.0, 0.0]
        steps = health.steps
        n_steps = steps.n if steps is not None else 0
        counters["n_decode_total"] = n_steps
        gauges = {
            "prompt_tokens_seconds": window[0] / window[1] if window[1] > 0 else 0.0,
            "predicted_tokens_seconds": window[2] / window[3] if window[3] > 0 else 0.0,
            "requests_processing": health.n_running,
            "requests_deferred": health.n_waiting,
            "n_busy_slots_per_decode": (steps.n_busy if steps is not None else 0) / max(n_steps, 1),
            "kv_cache_usage_ratio": stats.usage.ratio,
            "kv_cache_tokens": stats.usage.n_cells_used,
        }
        lines = []
        for kind, values, helps in (("counter", counters, COUNTERS), ("gauge", gauges, GAUGES)):
            for name, value in values.items():
                lines += [
                    f"# HELP llamacpp:{name} {helps[name]}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {float(value):g}",  # C++'s default stream format for a double
                ]
        return "\n".join(lines) + "\n"
