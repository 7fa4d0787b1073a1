"""Pods that hold the driver without asking for a GPU, against the strict fake API
(tests/kubefake.py) over test_upgrade.py's scene (V1 serving, a mirror holding V1 and V2):

- a pod of the `nvidia` runtime class (the toolkit mounts the loaded driver into it),
- NVIDIA's DRA kubelet plugin (labelled `nvidia-dra-driver-gpu-component: kubelet-plugin` by
  its chart, deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml @
  22407113785e; it serves CDI specs of the loaded driver until it restarts),
- a third-party GPU client by gpu-operator's convention (`nvidia.com/gpu.deploy.client`, the
  node label its clients select on: controllers/state_manager.go @ a22dbf671f2e).

Each kind is counted and goes by the GPU pods' rules: evicted (a PodDisruptionBudget's 429
retried), refused without UPGRADE_FORCE / UPGRADE_DELETE_EMPTYDIR_DATA, and as a DaemonSet
pod deleted only with UPGRADE_RESTART_DAEMONSETS. A pod that holds nothing stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubefake
import pytest
from host import test_upgrade
from host.test_upgrade import DS_UID, NODE, UID, V2, cluster_with, loaded, upgrade
from host.test_upgrade_selection import IDLE, WEB, Scenes, evicted, holding, untouched
from kubefake import pod_doc

from installer.errors import UpgradeBlockedError
from installer.upgrade.selection import EMPTYDIR, FORCE, RESTART_DAEMONSETS

repo, scene = test_upgrade.repo, test_upgrade.scene  # the fixtures
Doc = dict[str, Any]


def runtime_class(doc: Doc) -> Doc:
    doc["spec"]["runtimeClassName"] = "nvidia"
    return doc


def dra_plugin(doc: Doc) -> Doc:
    doc["metadata"]["labels"] = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu",
                                 "nvidia-dra-driver-gpu-component": "kubelet-plugin"}
    return doc


def gpu_client(doc: Doc) -> Doc:
    doc["spec"]["nodeSelector"] = {"nvidia.com/gpu.deploy.client": "true"}
    return doc


KINDS: dict[str, tuple[Callable[[Doc], Doc], str]] = {
    "runtime-class": (runtime_class, "runtimeClassName nvidia"),
    "dra-plugin": (dra_plugin, "NVIDIA's DRA kubelet plugin"),
    "gpu-client": (gpu_client, "a GPU client (nvidia.com/gpu.deploy.client)"),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> tuple[Callable[[Doc], Doc], str]:
    return KINDS[request.param]


def test_it_is_evicted_through_a_budget_and_a_plain_pod_stays(
        scene: Scenes, kind: tuple[Callable[[Doc], Doc], str]) -> None:
    node, mirror = scene
    mark, _ = kind
    pid = holding(node, UID)
    cluster = cluster_with(node, pod_doc("train", UID, NODE),
                           mark(pod_doc("holder", IDLE, NODE)), pod_doc("web", WEB, NODE),
                           holders={"train": pid})
    cluster.evictions["default/holder"] = [429, 429]  # a PodDisruptionBudget, then allowed
    with kubefake.serve(cluster) as api:
        done = upgrade(node, mirror, api, "--upgrade-timeout", "30")
    assert done.returncode == 0, done.stderr
    assert evicted(cluster) == ["evict:holder:201", "evict:holder:429", "evict:holder:429",
                                "evict:train:201"]  # the budget's refusals were retried
    assert sorted(cluster.pods) == ["default/web"]  # holds nothing: left alone
    assert cluster.errors == [] and loaded(node) == V2


def test_a_bare_one_with_an_emptydir_is_refused_then_goes_with_the_settings(
        scene: Scenes, kind: tuple[Callable[[Doc], Doc], str]) -> None:
    node, mirror = scene
    mark, why = kind
    pid = holding(node, UID)
    cluster = cluster_with(node, pod_doc("train", UID, NODE),
                           mark(pod_doc("holder", IDLE, NODE, owner=None,
                                        empty_dirs=("scratch",))),
                           pod_doc("web", WEB, NODE, owner=None), holders={"train": pid})
    with kubefake.serve(cluster) as api:
        blocked = upgrade(node, mirror, api)
        assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
        line = blocked.stderr.strip().splitlines()[-1]
        assert line.startswith("error(upgrade-blocked)")
        assert f"pod default/holder ({why}" in line
        assert FORCE in line and "emptyDir volume(s) scratch" in line and EMPTYDIR in line
        assert "default/web" not in line  # a bare pod holding nothing is no concern
        untouched(cluster, node)
        done = upgrade(node, mirror, api, "--upgrade-force", "--upgrade-delete-emptydir-data")
    assert done.returncode == 0, done.stderr
    assert evicted(cluster) == ["evict:holder:201", "evict:train:201"]
    assert sorted(cluster.pods) == ["default/web"]
    assert loaded(node) == V2


def test_a_daemonset_one_is_deleted_only_with_restart_daemonsets(
        scene: Scenes, kind: tuple[Callable[[Doc], Doc], str]) -> None:
    node, mirror = scene
    mark, why = kind
    pid = holding(node, UID)
    plugin = mark(pod_doc("holder-ds", DS_UID, NODE, owner="DaemonSet",
                          namespace="nvidia-dra-driver-gpu"))
    other = pod_doc("log-agent", WEB, NODE, owner="DaemonSet", namespace="logging")
    cluster = cluster_with(node, pod_doc("train", UID, NODE), plugin, other,
                           holders={"train": pid})
    with kubefake.serve(cluster) as api:
        blocked = upgrade(node, mirror, api)
        assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
        line = blocked.stderr.strip().splitlines()[-1]
        assert f"DaemonSet pod nvidia-dra-driver-gpu/holder-ds ({why}" in line
        assert RESTART_DAEMONSETS in line and "logging/log-agent" not in line
        untouched(cluster, node)
        done = upgrade(node, mirror, api, "--upgrade-restart-daemonsets")
    assert done.returncode == 0, done.stderr
    assert [s.rsplit(":", 1)[0] for s in cluster.steps()
            if s.startswith("delete:")] == ["delete:holder-ds"]
    assert evicted(cluster) == ["evict:train:201"]
    assert "logging/log-agent" in cluster.pods  # a DaemonSet pod holding nothing stays
    assert loaded(node) == V2
