"""daemonset/examples/metrics/networkpolicy.yaml: a strictly valid NetworkPolicy that selects
the agent pods of every overlay and admits only the monitoring namespace, only to the
agent's metrics port (Kubernetes' NetworkPolicy semantics: once a policy selects a pod for
Ingress, only what some policy allows gets in)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from metricexamples import EXAMPLES

from deploy.manifests import OVERLAYS, one, pod_spec, render

KUBERNETES_VERSIONS = ("1.28.0", "1.33.0")


def policy() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / "networkpolicy.yaml").read_text()) if d]
    return dict(doc)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strictly_valid(version: str) -> None:
    kubernetes_validate.validate(policy(), version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selects_the_agent_and_admits_only_monitoring_to_its_metrics_port(overlay: str) -> None:
    spec = policy()["spec"]
    daemonset = one(render(f"overlays/{overlay}"), "DaemonSet", "gpu-node-installer")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]  # no podSelector, no ipBlock
    (agent,) = pod_spec(daemonset)["containers"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}] and "metrics" in ports
    assert set(ports) == {"metrics"}  # nothing else of the agent's is left open
    assert not pod_spec(daemonset).get("hostNetwork")  # no policy holds a host-network pod
