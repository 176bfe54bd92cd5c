"""llama-server's ``/metrics`` families (``llamacpp:*``, server/telemetry/llamacpp_metrics.py)
beside slotserve's own: every name with its help and type as llama-server writes
them, read by the Prometheus parser, and the counters agreeing with the requests'
``timings``."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from server.telemetry.llamacpp_metrics import COUNTERS, GAUGES


def llamacpp(url: str) -> dict[str, tuple[str, float]]:
    """{name: (type, value)} of the llamacpp: families, by the Prometheus parser (keyed
    by the name llama-server writes: the parser adds ``_total`` to every counter's
    sample, so the family's name is the key, with ``_total`` where the text has it)."""
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("llamacpp:"):
            (sample,) = family.samples
            name = sample.name if f"\n{sample.name} " in text else family.name
            out[name] = (family.type, sample.value)
    return out


def completion(url: str, **body) -> dict:
    r = httpx.post(url + "/completion", json={"temperature": 0, **body}, timeout=60)
    assert r.status_code == 200
    return r.json()["timings"]


def test_every_llamacpp_family_has_its_name_help_and_type(demo_server):
    completion(demo_server.url, prompt="def main():", n_predict=8)
    text = httpx.get(demo_server.url + "/metrics").text
    families = llamacpp(demo_server.url)
    for name, help_text in COUNTERS.items():
        assert f"# HELP llamacpp:{name} {help_text}\n# TYPE llamacpp:{name} counter\nllamacpp:{name} " in text
        assert families[f"llamacpp:{name}"][0] == "counter"
    for name in GAUGES:
        assert families[f"llamacpp:{name}"][0] == "gauge"
    assert families["llamacpp:n_decode_total"][1] > 0
    assert families["llamacpp:n_tokens_max"][1] >= 9
    wait_for(lambda: llamacpp(demo_server.url)["llamacpp:requests_processing"][1] == 0, what="idle")
    assert 0 <= families["llamacpp:kv_cache_usage_ratio"][1] <= 1


def test_the_counters_follow_the_requests_timings(demo_server):
    """Prompt tokens computed and cached, and tokens predicted, as the requests'
    ``timings`` report them (the same prompt twice: the second reuses the slot)."""
    before = llamacpp(demo_server.url)
    prompt = "import os\nimport sys\n\n\ndef read_config(path):\n"
    sums = {"prompt_n": 0, "cache_n": 0, "predicted_n": 0}
    for n_predict in (4, 16):
        timings = completion(demo_server.url, prompt=prompt, n_predict=n_predict, id_slot=0)
        for key in sums:
            sums[key] += timings[key]
    assert sums["cache_n"] > 0

    def delta(name: str) -> float:
        return llamacpp(demo_server.url)[f"llamacpp:{name}"][1] - before[f"llamacpp:{name}"][1]

    wait_for(lambda: delta("tokens_predicted_total") == sums["predicted_n"], what="tokens predicted counted")
    assert delta("prompt_tokens_total") == sums["prompt_n"]
    assert delta("prompt_tokens_cached_total") == sums["cache_n"]
    assert delta("prompt_seconds_total") > 0 and delta("tokens_predicted_seconds_total") > 0
    assert llamacpp(demo_server.url)["llamacpp:predicted_tokens_seconds"][1] >= 0
