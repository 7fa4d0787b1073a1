"""The gke-cos overlay on GKE's arm64 GPU node pools (A4X: GB200 on COS arm64).

The rendered DaemonSet's node affinity and tolerations are evaluated against the labels
and taints GKE gives an A4X node (as GKE's own `daemonset-preloaded-latest-a4x.yaml`
selects them: instance type a4x-highgpu-4g, an accelerator label, no GKE-managed driver),
an x86 GPU node, and the nodes the overlay must leave alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from deploy.manifests import one, pod_spec, render
from installer.node import arches

A4X = {"kubernetes.io/arch": "arm64", "node.kubernetes.io/instance-type": "a4x-highgpu-4g",
       "cloud.google.com/gke-accelerator": "nvidia-gb200",
       "cloud.google.com/gke-os-distribution": "cos"}
A4X_TAINTS = ({"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"},
              {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
A3 = {"kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "a3-highgpu-8g",
      "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator == "In":
        return labels.get(key) in expression["values"]
    if operator == "NotIn":
        return labels.get(key) not in expression["values"]
    raise AssertionError(f"operator {operator} not evaluated here")


def schedules(spec: dict[str, Any], labels: dict[str, str],
              taints: tuple[dict[str, str], ...] = ()) -> bool:
    """Required node affinity (terms ORed, expressions ANDed) and NoSchedule taints, as the
    scheduler reads them."""
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    matched = any(all(_expression_holds(e, labels) for e in term["matchExpressions"])
                  for term in terms)
    tolerated = all(any((t.get("operator") == "Exists" and "key" not in t)
                        or (t.get("key") == taint["key"]
                            and t.get("value", taint["value"]) == taint["value"])
                        for t in spec.get("tolerations", []))
                    for taint in taints)
    return matched and tolerated


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return pod_spec(one(render("overlays/gke-cos"), "DaemonSet", "gpu-node-installer"))


class TestGkeCosOnArm64:
    def test_a4x_node_gets_the_installer(self, spec: dict[str, Any]) -> None:
        assert schedules(spec, A4X, A4X_TAINTS)

    def test_a4x_node_pool_with_driver_disabled_too(self, spec: dict[str, Any]) -> None:
        labels = {**A4X, "cloud.google.com/gke-gpu-driver-version": "disabled"}
        assert schedules(spec, labels, A4X_TAINTS)

    def test_x86_gpu_node_still_does(self, spec: dict[str, Any]) -> None:
        assert schedules(spec, A3)

    def test_a4x_node_whose_driver_gke_installs_is_left_alone(self,
                                                              spec: dict[str, Any]) -> None:
        labels = {**A4X, "cloud.google.com/gke-gpu-driver-version": "latest"}
        assert not schedules(spec, labels, A4X_TAINTS)

    def test_a_confidential_node_is_left_alone(self, spec: dict[str, Any]) -> None:
        for kind in ("TDX", "SEV"):
            for labels in (A3, {**A3, "cloud.google.com/gke-gpu-driver-version": "disabled"}):
                assert not schedules(
                    spec, {**labels, "cloud.google.com/gke-confidential-nodes-instance-type":
                           kind})

    def test_an_arch_the_image_is_not_built_for_is_left_alone(self,
                                                               spec: dict[str, Any]) -> None:
        assert not schedules(spec, {**A3, "kubernetes.io/arch": "s390x"})

    def test_the_arches_are_the_installers_own(self, spec: dict[str, Any]) -> None:
        terms = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for term in terms:
            (arch,) = [e for e in term["matchExpressions"] if e["key"] == "kubernetes.io/arch"]
            assert sorted(arch["values"]) == sorted(arches.DEBIAN_ARCHES)
