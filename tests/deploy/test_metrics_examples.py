"""daemonset/examples/metrics/: the monitors, the adapter rule, the HPA and the dashboard are
valid for what reads them, and agree with each other and with the agent's manifests.

Kubernetes objects (HPA, Deployment, ConfigMap) go through the strict Kubernetes schemas the
deploy tests use. The PodMonitor and PodMonitoring go through hand-written subsets of their
CRDs' schemas (tests/deploy/monitoring_schemas.py says why and what they do not prove).
Every PromQL expression passes `promtool check rules`; tests/host/test_metrics_prometheus.py
runs them against a real Prometheus scraping the agent."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from metricexamples import (
    EXAMPLES,
    adapter_query,
    adapter_rules,
    dashboard,
    dashboard_queries,
    panels,
    variable_metrics,
)
from prometheus import binary

from deploy.manifests import OVERLAYS, one, pod_spec, render
from deploy.monitoring_schemas import CLUSTER_POD_MONITORING, POD_MONITOR, POD_MONITORING

KUBERNETES_VERSIONS = ("1.28.0", "1.33.0")
# The names the agent exports (docs/metrics.md); the dashboard and rule may use only these.
METRICS = {
    "duty_cycle", "memory_used", "memory_total", "request", "duty_cycle_gpu_node",
    "memory_used_gpu_node", "memory_total_gpu_node", "gpu_node_installer_info",
    "gpu_node_installer_ready", "gpu_node_installer_last_install_exit_code",
    "gpu_node_installer_install_stage_seconds", "gpu_node_installer_install_fast_path",
    "gpu_node_installer_daemon_up", "gpu_node_installer_daemon_restarts_total",
    "gpu_node_installer_gpu_fabric_state", "gpu_node_installer_xid_errors_total",
    "gpu_node_installer_gpu_duty_cycle_ratio", "gpu_node_installer_gpu_memory_used_bytes",
    "gpu_node_installer_gpu_memory_total_bytes", "gpu_node_installer_gpu_temperature_celsius",
    "gpu_node_installer_gpu_power_watts", "gpu_node_installer_gpu_ecc_errors_total",
    "gpu_node_installer_gpu_remapped_rows", "gpu_node_installer_collection_errors_total",
    "gpu_node_installer_pod_resources_available", "gpu_node_installer_metrics_age_seconds",
    "gpu_node_installer_next_kernel_ready",
}
MONITORS = ["podmonitor.yaml", "podmonitoring.yaml", "clusterpodmonitoring.yaml"]
PROMQL_WORDS = {"max", "sum", "avg", "count", "by", "increase", "rate", "without", "on",
                "ignoring"}


def _docs(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", ["hpa.yaml", "adapter-rule.yaml"])
def test_kubernetes_objects_strictly_valid(name: str, version: str) -> None:
    for doc in _docs(name):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(("name", "schema"), [
    ("podmonitor.yaml", POD_MONITOR), ("podmonitoring.yaml", POD_MONITORING),
    ("clusterpodmonitoring.yaml", CLUSTER_POD_MONITORING)])
def test_monitors_match_their_crd_schema(name: str, schema: dict) -> None:
    (monitor,) = _docs(name)
    jsonschema.validate(monitor, schema)
    broken = copy.deepcopy(monitor)  # guards the guard: a misspelt field fails
    broken["spec"]["selecter"] = broken["spec"]["selector"]
    with pytest.raises(jsonschema.ValidationError, match="selecter"):
        jsonschema.validate(broken, schema)


def _endpoints(monitor: dict) -> list[dict]:
    return monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", MONITORS)
def test_monitors_select_the_agent_and_its_metrics_port(name: str, overlay: str) -> None:
    (monitor,) = _docs(name)
    template = one(render(f"overlays/{overlay}"), "DaemonSet", "gpu-node-installer")
    labels = template["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (agent,) = pod_spec(template)["containers"]
    ports = {port.get("name") for port in agent.get("ports", [])}
    assert {endpoint["port"] for endpoint in _endpoints(monitor)} <= ports, ports


def test_podmonitor_keeps_the_workloads_labels() -> None:
    """duty_cycle{namespace,pod,container} names the GPU workload, not the agent: honorLabels
    (tests/host/test_prometheus_harness.py shows what happens without it)."""
    (monitor,) = _docs("podmonitor.yaml")
    (endpoint,) = _endpoints(monitor)
    assert endpoint["honorLabels"] is True
    (managed,) = _docs("podmonitoring.yaml")
    assert not {"pod", "container"} & set(managed["spec"]["targetLabels"]["metadata"])
    (cluster,) = _docs("clusterpodmonitoring.yaml")
    assert not {"namespace", "pod", "container"} & set(
        cluster["spec"]["targetLabels"]["metadata"])
    assert "namespace" not in cluster["metadata"]  # cluster-scoped


def test_hpa_asks_for_the_metric_the_adapter_serves() -> None:
    hpa, deployment = _docs("hpa.yaml")
    served = {rule["name"]["as"] for rule in adapter_rules()}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (deployment["kind"],
                                                 deployment["metadata"]["name"])
    assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1


def test_adapter_rule_maps_duty_cycle_to_pods() -> None:
    (rule,) = adapter_rules()
    assert rule["seriesQuery"].startswith("duty_cycle{")
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert adapter_query(rule, "ml", ["a", "b"]) == \
        'avg by (pod) (duty_cycle{namespace="ml",pod=~"a|b"})'


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]] + \
        [p["id"] for row in board["panels"] for p in row.get("panels", [])]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    covered = " ".join(panel["title"].lower() for panel in panels(board))
    for topic in ("utilisation", "memory", "temperature", "power", "ecc", "xid", "ready",
                  "daemons", "fabric"):
        assert topic in covered, topic


def test_dashboard_uses_only_exported_metrics() -> None:
    used = set(variable_metrics())
    for _, expr in dashboard_queries():
        no_strings = re.sub(r'"[^"]*"', "", expr)
        no_labels = re.sub(r"\{[^}]*\}|\[[^]]*\]|by \([^)]*\)", "", no_strings)
        used |= set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", no_labels)) - PROMQL_WORDS
    assert used <= METRICS, used - METRICS


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool parses each (as a recording rule): a PromQL syntax error fails here, offline."""
    queries = [expr for _, expr in dashboard_queries()]
    queries += [adapter_query(rule, "ml", ["p"]) for rule in adapter_rules()]
    queries += [rule["seriesQuery"] for rule in adapter_rules()]
    rules = {"groups": [{"name": "examples", "rules": [
        {"record": f"example:q{i}", "expr": expr} for i, expr in enumerate(queries)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([binary("promtool"), "check", "rules", str(path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(queries)} rules found" in check.stdout
