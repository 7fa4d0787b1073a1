"""Which pods a live upgrade moves, what it refuses to lose, and how it waits for them,
against the strict fake API (tests/kubefake.py) over the same
scene as test_upgrade.py: a node serving V1, a mirror holding V1 and V2.

- kubectl drain's refusals: a pod no controller recreates (bare, or its DaemonSet gone) and
  a pod with emptyDir data block the upgrade before anything is touched (exit 15, every pod
  named with the setting that allows it) and go with UPGRADE_FORCE and
  UPGRADE_DELETE_EMPTYDIR_DATA;
- every pod that asks for a GPU goes, idle or not: `nvidia.com/gpu*`, `nvidia.com/mig-*`
  (init containers too), DRA claims; static pods still block;
- evictions in a namespace being deleted (403 NamespaceTerminating) are retried, and pods
  that stay Terminating through their grace period are waited for before the unload.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import kubefake
import pytest
import requests
from e2e import Scene
from host import test_upgrade
from host.test_upgrade import (
    DS_UID,
    NODE,
    UID,
    V1,
    V2,
    cluster_with,
    evicting,
    holding,
    loaded,
    untouched,
    upgrade,
)
from kubefake import Cluster, node_doc, pod_doc

from installer.config import load_config
from installer.errors import ConfigError, UpgradeBlockedError, UpgradeTimeoutError
from installer.node import kube

NOTEBOOK = "21111111-2222-4333-8444-555555555555"
CACHE = "31111111-2222-4333-8444-555555555555"
IDLE = "41111111-2222-4333-8444-555555555555"
WEB = "51111111-2222-4333-8444-555555555555"
GPU = {"nvidia.com/gpu": "1"}
Scenes = tuple[Scene, str]
repo, scene = test_upgrade.repo, test_upgrade.scene  # the fixtures: V1 serving, V1+V2 mirror


def evicted(cluster: Cluster) -> list[str]:
    return sorted(s for s in cluster.steps() if s.startswith("evict:"))


class TestRefusals:
    """Item 1: what kubectl drain refuses without --force / --delete-emptydir-data."""

    def test_a_bare_pod_and_an_emptydir_pod_block_then_go_with_the_settings(
            self, scene: Scenes) -> None:
        node, mirror = scene
        notebook = holding(node, NOTEBOOK)
        cache = holding(node, CACHE)
        cluster = cluster_with(
            node, pod_doc("notebook", NOTEBOOK, NODE, owner=None, limits=GPU),
            pod_doc("cache", CACHE, NODE, limits=GPU, empty_dirs=("scratch", "models")),
            holders={"notebook": notebook, "cache": cache})
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api)
            assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
            assert "error(upgrade-blocked)" in blocked.stderr
            assert "pod default/notebook" in blocked.stderr
            assert "no controller" in blocked.stderr and "UPGRADE_FORCE=true" in blocked.stderr
            assert "pod default/cache" in blocked.stderr
            assert "emptyDir volume(s) scratch, models" in blocked.stderr
            assert "UPGRADE_DELETE_EMPTYDIR_DATA=true" in blocked.stderr
            assert "nothing was cordoned" in blocked.stderr
            untouched(cluster, node)
            assert sorted(cluster.pods) == ["default/cache", "default/notebook"]
            assert cluster.states() == ["upgrade-required", "upgrade-failed"]
            # one setting is not enough: the other pod still blocks, alone
            half = upgrade(node, mirror, api, "--upgrade-force")
            assert half.returncode == UpgradeBlockedError.code, half.stderr
            assert "default/notebook" not in half.stderr.split("error(upgrade-blocked)")[-1]
            assert "default/cache" in half.stderr
            untouched(cluster, node)
            done = upgrade(node, mirror, api, "--upgrade-force",
                           "--upgrade-delete-emptydir-data")
        assert done.returncode == 0, done.stderr
        assert evicted(cluster) == ["evict:cache:201", "evict:notebook:201"]
        assert cluster.pods == {} and loaded(node) == V2
        assert cluster.errors == []

    def test_drain_refuses_a_bare_pod_that_holds_no_gpu(self, scene: Scenes) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        cluster = cluster_with(node, pod_doc("train", UID, NODE),
                               pod_doc("debug-shell", WEB, NODE, owner=None),
                               holders={"train": pid})
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api, policy="drain")
        assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
        assert "pod default/debug-shell (UPGRADE_POLICY=drain)" in blocked.stderr
        assert "UPGRADE_FORCE=true" in blocked.stderr
        assert "default/train" not in blocked.stderr.split("cannot free the GPUs")[-1]
        untouched(cluster, node)

    def test_a_static_pod_that_asks_for_a_gpu_blocks(self, scene: Scenes) -> None:
        node, mirror = scene
        static = pod_doc("inference-n1", IDLE, NODE, owner="Node", limits=GPU,
                         annotations={"kubernetes.io/config.mirror": "abc"})
        cluster = cluster_with(node, static)
        holding(node, UID)  # a holder in a pod the API lists elsewhere: named too
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api)
        assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
        assert ("static pod default/inference-n1 (asks for nvidia.com/gpu) cannot be "
                "evicted") in blocked.stderr
        assert f"is in pod {UID}, which the API does not list" in blocked.stderr
        untouched(cluster, node)


class TestGpuPods:
    """Item 4: every pod that asks for a GPU goes, busy or idle."""

    def test_an_idle_gpu_pod_is_evicted_with_the_holders(self, scene: Scenes) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        plugin = pod_doc("gpu-feature-discovery-x", DS_UID, NODE, owner="DaemonSet",
                         limits=GPU, namespace="kube-system")
        cluster = cluster_with(node, pod_doc("train", UID, NODE, limits=GPU),
                               pod_doc("idle", IDLE, NODE, limits={"nvidia.com/gpu": "2"}),
                               pod_doc("web", WEB, NODE), plugin, holders={"train": pid})
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert evicted(cluster) == ["evict:idle:201", "evict:train:201"]
        # not asking for a GPU, or a live DaemonSet's pod (recreated at once): left alone
        assert sorted(cluster.pods) == ["default/web", "kube-system/gpu-feature-discovery-x"]
        assert cluster.errors == [] and loaded(node) == V2

    def test_mig_and_dra_pods_go_finished_ones_are_ignored(self, scene: Scenes) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        cluster = cluster_with(
            node, pod_doc("train", UID, NODE),
            pod_doc("mig-warmup", IDLE, NODE, init_limits={"nvidia.com/mig-1g.10gb": "1"}),
            pod_doc("dra", NOTEBOOK, NODE, claim="gpu-claim-0"),
            pod_doc("finished", CACHE, NODE, owner=None, limits=GPU, phase="Succeeded",
                    empty_dirs=("out",)),
            holders={"train": pid})
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert evicted(cluster) == ["evict:dra:201", "evict:mig-warmup:201",
                                    "evict:train:201"]
        assert sorted(cluster.pods) == ["default/finished"]  # neither evicted nor blocking
        assert cluster.errors == [] and loaded(node) == V2


class TestOrphanDaemonSetPod:
    """Item 6: a DaemonSet pod whose DaemonSet is gone is unmanaged, as kubectl sees it."""

    def test_blocks_without_force_and_is_evicted_with_it(self, scene: Scenes) -> None:
        node, mirror = scene
        pid = holding(node, DS_UID, "dcgm-exporter")
        cluster = cluster_with(node, pod_doc("exporter-x1", DS_UID, NODE, owner="DaemonSet",
                                             namespace="monitoring"),
                               holders={"exporter-x1": pid})
        del cluster.daemonsets["monitoring/exporter-x1-owner"]
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api, "--upgrade-restart-daemonsets")
            assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
            assert "its DaemonSet exporter-x1-owner is gone" in blocked.stderr
            assert "UPGRADE_FORCE=true" in blocked.stderr
            assert "UPGRADE_RESTART_DAEMONSETS" not in blocked.stderr.split(
                "cannot free the GPUs")[-1]
            untouched(cluster, node)
            done = upgrade(node, mirror, api, "--upgrade-force")
        assert done.returncode == 0, done.stderr
        assert "/apis/apps/v1/namespaces/monitoring/daemonsets/exporter-x1-owner" in [
            c.path for c in cluster.calls]
        assert evicted(cluster) == ["evict:exporter-x1:201"]  # evicted, not deleted
        assert [c for c in cluster.calls if c.method == "DELETE"] == []
        assert loaded(node) == V2


class TestNamespaceTerminating:
    """Item 6: an eviction in a namespace being deleted is retried as kubectl does."""

    def test_a_403_then_201_is_retried(self, scene: Scenes) -> None:
        node, mirror = scene
        cluster, done = evicting(node, mirror, [403, 201], "--upgrade-timeout", "30")
        assert done.returncode == 0, done.stderr
        assert evicted(cluster) == ["evict:train:201", "evict:train:403"]
        refused = [e["message"] for e in cluster.events
                   if e["reason"] == "DriverUpgradeEvictionRefused"]
        assert len(refused) == 1 and "namespace is terminating" in refused[0]
        assert loaded(node) == V2

    def test_the_namespace_controller_deleting_the_pod_ends_the_retries(
            self, scene: Scenes) -> None:
        """Evictions there never succeed; once the pod shows a deletionTimestamp it is
        only waited for."""
        node, mirror = scene
        pid = holding(node, UID)
        cluster = cluster_with(node, pod_doc("train", UID, NODE, namespace="ml", grace=5),
                               holders={"train": pid})
        cluster.terminating_namespaces.add("ml")
        cluster.exits_after["ml/train"] = 0.5
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-timeout", "60")
        assert done.returncode == 0, done.stderr
        assert evicted(cluster) == ["evict:train:403"]
        assert cluster.errors == [] and loaded(node) == V2

    def test_refused_until_the_deadline_is_a_timeout_naming_why(self, scene: Scenes) -> None:
        node, mirror = scene
        cluster, done = evicting(node, mirror, [403] * 1000, "--upgrade-timeout", "1")
        assert done.returncode == UpgradeTimeoutError.code, done.stderr
        assert "default/train (HTTP 403: its namespace is being deleted" in done.stderr
        assert cluster.node()["spec"]["unschedulable"] is True
        assert loaded(node) == V1


class TestTerminatingPods:
    """Item 6: evicted pods stay Terminating until their processes end; the unload waits."""

    def test_a_pod_that_ignores_sigterm_is_waited_for_through_its_grace_period(
            self, scene: Scenes) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        cluster = cluster_with(node, pod_doc("train", UID, NODE),
                               pod_doc("idle", IDLE, NODE, limits=GPU, grace=2),
                               holders={"train": pid})
        cluster.exits_after["default/idle"] = None  # killed only when the grace period ends
        cluster.exits_after["default/train"] = 1.0  # exits a second after SIGTERM
        cluster.observe = lambda: f"{loaded(node)} {' '.join(sorted(cluster.pods))}"
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        gets = [(c.path.rsplit("/", 1)[-1], c.status) for c in cluster.calls
                if c.method == "GET" and "/pods/" in c.path]
        assert ("idle", 200) in gets and gets.index(("idle", 200)) < gets.index(("idle", 404))
        # while either pod was still in the API, still Terminating, V1 was loaded
        for call in cluster.calls:
            if "default/idle" in call.observed or "default/train" in call.observed:
                assert call.observed.startswith(V1), call
        assert loaded(node) == V2 and cluster.errors == []

    def test_a_grace_period_beyond_the_timeout_keeps_v1(self, scene: Scenes) -> None:
        node, mirror = scene
        holding(node, UID)
        cluster = cluster_with(node, pod_doc("train", UID, NODE, grace=600))
        cluster.exits_after["default/train"] = None
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-timeout", "1")
        assert done.returncode == UpgradeTimeoutError.code, done.stderr
        assert "default/train were still terminating" in done.stderr
        assert "default/train" in cluster.pods and loaded(node) == V1
        assert cluster.pods["default/train"]["metadata"]["deletionGracePeriodSeconds"] == 600


class TestSettings:
    def test_flags_and_env_default_false(self, tmp_path: Path) -> None:
        base = {"NODE_NAME": NODE, "UPGRADE_POLICY": "evict", "HOST_ROOT": str(tmp_path),
                "PROC_ROOT": str(tmp_path), "SYS_ROOT": str(tmp_path)}
        config = load_config({}, base)
        assert (config.upgrade_force, config.upgrade_delete_emptydir_data) == (False, False)
        config = load_config({}, base | {"UPGRADE_FORCE": "true",
                                         "UPGRADE_DELETE_EMPTYDIR_DATA": "1"})
        assert (config.upgrade_force, config.upgrade_delete_emptydir_data) == (True, True)
        config = load_config({"upgrade_force": True}, base)
        assert (config.upgrade_force, config.upgrade_delete_emptydir_data) == (True, False)
        with pytest.raises(ConfigError, match="UPGRADE_FORCE='maybe'"):
            load_config({}, base | {"UPGRADE_FORCE": "maybe"})


class TestFake:
    """Guards the guard: the fake's Terminating pods, DaemonSets and 403s."""

    def _client(self, directory: Path, url: str) -> kube.ApiServer:
        (directory / "token").write_text(kubefake.TOKEN)
        api = kube.api_server(url, directory, {})
        assert api is not None
        return api

    def test_terminating_pods_daemonsets_and_namespace_403(self, tmp_path: Path) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                          pods={"default/a": pod_doc("a", UID, NODE, grace=1),
                                "ml/b": pod_doc("b", IDLE, NODE, namespace="ml"),
                                "default/c": pod_doc("c", DS_UID, NODE, owner="DaemonSet")})
        cluster.exits_after["default/a"] = None
        cluster.terminating_namespaces.add("ml")
        gone: list[str] = []
        cluster.on_evict = lambda pod: gone.append(pod["metadata"]["name"])
        with kubefake.serve(cluster) as url:
            api = self._client(tmp_path, url)
            assert kube.evict(api, "default", "a", UID, None) == "evicted"
            pod = kube.get_pod(api, "default", "a")
            assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 1
            assert pod["metadata"]["deletionTimestamp"].endswith("Z") and gone == []
            _until(lambda: kube.get_pod(api, "default", "a") is None)
            assert gone == ["a"]
            assert kube.evict(api, "ml", "b", IDLE, 0) == "namespace-terminating"
            assert kube.get_pod(api, "ml", "b") is None  # the namespace controller took it
            assert kube.daemonset_exists(api, "default", "c-owner") is True
            assert kube.daemonset_exists(api, "default", "gone") is False
            answer = requests.post(f"{url}/api/v1/namespaces/ml/pods/x/eviction", timeout=5,
                                   headers={"Authorization": f"Bearer {kubefake.TOKEN}"},
                                   json={"apiVersion": "policy/v1", "kind": "Eviction",
                                         "metadata": {"name": "x", "namespace": "ml"}})
            assert answer.status_code == 404  # no such pod, whatever the namespace
        cluster.pods["ml/b2"] = pod_doc("b2", NOTEBOOK, NODE, namespace="ml")
        with kubefake.serve(cluster) as url:
            api = self._client(tmp_path, url)
            with pytest.raises(kube.KubeError) as caught:
                api.call("POST", "/api/v1/namespaces/ml/pods/b2/eviction",
                         {"apiVersion": "policy/v1", "kind": "Eviction",
                          "metadata": {"name": "b2", "namespace": "ml"}}, "application/json")
            assert caught.value.status == 403
            assert caught.value.causes == ("Forbidden", "NamespaceTerminating")
        assert cluster.errors == []


def _until(check: Callable[[], bool], limit_s: float = 30.0) -> None:
    """Poll `check` (the fake removes pods on its own timers); fail after `limit_s`."""
    end = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < end, "the fake never removed the pod"
        time.sleep(0.05)
