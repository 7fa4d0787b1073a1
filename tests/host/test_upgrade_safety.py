"""What a live upgrade must never lose: emptyDir data on any path that removes a pod, and a
pod that was recreated under the name of the one it planned to evict.

The emptyDir rule (kubectl drain's --delete-emptydir-data) holds however a pod would go:
evicted, deleted as a GPU DaemonSet's pod (UPGRADE_RESTART_DAEMONSETS), or taken away by
the gpu-operator pause, under `evict` and `drain` alike (`refuse` removes no pod at all).
Each Eviction carries the pod's UID as a precondition; the strict fake answers 409 for
another UID, as the API server does (tests/kubefake.py cites its source). Fixtures and
helpers come from test_upgrade.py.
"""

from __future__ import annotations

import threading
import time

import kubefake
import pytest
import requests
from e2e import Scene
from host import test_upgrade
from host.test_upgrade import (
    DS_UID,
    NODE,
    UID,
    V2,
    cluster_with,
    holding,
    kernel,
    loaded,
    untouched,
    upgrade,
)
from host.test_upgrade_daemonsets import DEPLOY, OPERATOR_LABELS, Kubelet
from kubefake import Cluster, DaemonSet, add_daemonset, node_doc, pod_doc

from installer.errors import ModuleInUseError, UpgradeBlockedError
from installer.node import kube
from installer.node.cgroup import PodCgroup
from installer.node.holders import Holder
from installer.upgrade import selection

repo, scene = test_upgrade.repo, test_upgrade.scene  # the fixtures: V1 serving, V1+V2 mirror
Scenes = tuple[Scene, str]
EMPTYDIR = "UPGRADE_DELETE_EMPTYDIR_DATA=true"
REPLACEMENT = "61111111-2222-4333-8444-555555555555"


class TestEmptyDirRule:
    """Every way a pod is made to go, every policy: refused without the setting."""

    @staticmethod
    def _plan(doc: dict[str, object], *, policy: str, held: bool, paused: bool = False,
              **rules: bool) -> selection.Plan:
        pod = selection.pod_from_api(doc)
        holders = [Holder(7, "exporter", PodCgroup(pod.uid, "burstable", "systemd"))] \
            if held else []
        return selection.plan(holders, [pod], node=NODE,
                              rules=selection.Rules(policy, **rules),
                              daemonset_exists=lambda _: True,
                              paused=[pod] if paused else [])

    @pytest.mark.parametrize("policy", ["evict", "drain"])
    @pytest.mark.parametrize("path", ["evict", "daemonset-delete", "operator-pause"])
    def test_refused_without_the_setting_allowed_with_it(self, policy: str, path: str
                                                         ) -> None:
        owner = "ReplicaSet" if path == "evict" else "DaemonSet"
        doc = pod_doc("exporter", DS_UID, NODE, owner=owner, empty_dirs=("profiles",),
                      limits={"nvidia.com/gpu": "1"})
        held, paused = path != "operator-pause", path == "operator-pause"
        with pytest.raises(UpgradeBlockedError) as caught:
            self._plan(doc, policy=policy, held=held, paused=paused, restart_daemonsets=True,
                       force=True)
        assert "default/exporter" in caught.value.message
        assert "emptyDir volume(s) profiles" in caught.value.message
        assert EMPTYDIR in caught.value.message
        allowed = self._plan(doc, policy=policy, held=held, paused=paused,
                             restart_daemonsets=True, delete_emptydir_data=True)
        assert [p.name for p in allowed.evict] == (["exporter"] if path == "evict" else [])
        assert [p.name for p in allowed.delete] == (
            ["exporter"] if path == "daemonset-delete" else [])

    @pytest.mark.parametrize("policy", ["evict", "drain"])
    def test_a_gpu_daemonset_pod_with_an_emptydir_is_refused_then_deleted_with_it(
            self, scene: Scenes, policy: str) -> None:
        node, mirror = scene
        pid = holding(node, DS_UID, "dcgm-exporter")
        exporter = pod_doc("dcgm-exporter-x1", DS_UID, NODE, namespace="monitoring",
                           owner="DaemonSet", empty_dirs=("profiles",))
        cluster = cluster_with(node, exporter, holders={"dcgm-exporter-x1": pid})
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api, "--upgrade-restart-daemonsets", policy=policy)
            assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
            line = blocked.stderr.strip().splitlines()[-1]
            assert line.startswith("error(upgrade-blocked)")
            assert "DaemonSet pod monitoring/dcgm-exporter-x1" in line
            assert "emptyDir volume(s) profiles" in line and EMPTYDIR in line
            untouched(cluster, node)
            assert "monitoring/dcgm-exporter-x1" in cluster.pods
            done = upgrade(node, mirror, api, "--upgrade-restart-daemonsets",
                           "--upgrade-delete-emptydir-data", policy=policy)
        assert done.returncode == 0, done.stderr
        assert [s.rsplit(":", 1)[0] for s in cluster.steps()
                if s.startswith("delete:")] == ["delete:dcgm-exporter-x1"]
        assert loaded(node) == V2

    def test_under_refuse_the_gpu_daemonset_pod_with_an_emptydir_stays(self, scene: Scenes
                                                                       ) -> None:
        """The third policy: refuse removes no pod at all, whatever the other settings."""
        node, mirror = scene
        holding(node, DS_UID, "dcgm-exporter")
        exporter = pod_doc("dcgm-exporter-x1", DS_UID, NODE, namespace="monitoring",
                           owner="DaemonSet", empty_dirs=("profiles",))
        cluster = cluster_with(node, exporter)
        with kubefake.serve(cluster) as api:
            kept = upgrade(node, mirror, api, "--upgrade-restart-daemonsets", policy="refuse")
        assert kept.returncode == ModuleInUseError.code, kept.stderr
        assert kept.stderr.strip().splitlines()[-1].startswith("error(module-in-use)")
        untouched(cluster, node)
        assert "monitoring/dcgm-exporter-x1" in cluster.pods
        assert not any(c.method == "DELETE" for c in cluster.calls)

    def test_a_paused_operator_pod_with_an_emptydir_is_refused_before_the_pause(
            self, scene: Scenes) -> None:
        node, mirror = scene
        kubelet = Kubelet(node)
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE, OPERATOR_LABELS)},
                          observe=lambda: loaded(node))
        exporter = DaemonSet("gpu-operator", "nvidia-dcgm-exporter",
                             {f"{DEPLOY}dcgm-exporter": "true"}, empty_dirs=("metrics",),
                             on_create=lambda pod: kubelet.run(pod, "dcgm-exporter"))
        kubelet.run(add_daemonset(cluster, exporter, uid=DS_UID), "dcgm-exporter")
        cluster.on_evict = kubelet.stop
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api, "--upgrade-pause-operator")
            assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
            assert "gpu-operator/nvidia-dcgm-exporter-00001" in blocked.stderr
            assert "whose data the pause deletes" in blocked.stderr and EMPTYDIR in \
                blocked.stderr
            untouched(cluster, node)
            labels = cluster.node()["metadata"]["labels"]
            assert {k: labels[k] for k in OPERATOR_LABELS} == OPERATOR_LABELS  # not paused
            assert len(exporter.made) == 1
            done = upgrade(node, mirror, api, "--upgrade-pause-operator",
                           "--upgrade-delete-emptydir-data")
            time.sleep(0.5)  # the controller's recreation after the restore
        assert done.returncode == 0, done.stderr
        assert len(exporter.made) == 2 and loaded(node) == V2


class TestEvictionUidPrecondition:
    def test_the_fake_answers_409_for_another_uid_after_the_pdb(self, tmp_path: object
                                                                ) -> None:
        from pathlib import Path

        directory = Path(str(tmp_path)) / "sa"
        directory.mkdir()
        (directory / "token").write_text(kubefake.TOKEN)
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                          pods={"default/db-0": pod_doc("db-0", UID, NODE,
                                                        owner="StatefulSet")})
        cluster.evictions["default/db-0"] = [429]
        with kubefake.serve(cluster) as url:
            api = kube.api_server(url, directory, {})
            assert api is not None
            assert kube.evict(api, "default", "db-0", REPLACEMENT, None) == "refused"
            assert kube.evict(api, "default", "db-0", REPLACEMENT, 5) == "replaced"
            assert "deletionTimestamp" not in cluster.pods["default/db-0"]["metadata"]
            answer = requests.post(
                f"{url}/api/v1/namespaces/default/pods/db-0/eviction", timeout=5,
                headers={"Authorization": f"Bearer {kubefake.TOKEN}"},
                json={"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": "db-0", "namespace": "default"},
                      "deleteOptions": {"preconditions": {"uid": REPLACEMENT}}})
            assert answer.status_code == 409
            assert answer.json()["reason"] == "Conflict"
            assert (f"Precondition failed: UID in precondition: {REPLACEMENT}, UID in "
                    f"object meta: {UID}") in answer.json()["message"]
            assert kube.evict(api, "default", "db-0", UID, 5) == "evicted"
        bodies = [c.body for c in cluster.calls if c.path.endswith("/eviction")]
        assert [b["deleteOptions"]["preconditions"] for b in bodies  # type: ignore[index]
                ] == [{"uid": REPLACEMENT}] * 3 + [{"uid": UID}]

    def test_a_pod_recreated_under_the_same_name_is_never_evicted(self, scene: Scenes
                                                                  ) -> None:
        """A StatefulSet's db-0 holds the GPU; a PodDisruptionBudget refuses its first
        eviction; meanwhile it is deleted and recreated (new UID) on another node. The
        next eviction names the old UID: 409, and the new db-0 is left alone."""
        node, mirror = scene
        pid = holding(node, UID)
        cluster = cluster_with(node, pod_doc("db-0", UID, NODE, owner="StatefulSet"))
        cluster.nodes["gpu-node-2"] = node_doc("gpu-node-2")
        cluster.evictions["default/db-0"] = [429]

        def recreate_elsewhere() -> None:
            end = time.monotonic() + 20
            while time.monotonic() < end and not any(
                    c.path.endswith("/eviction") for c in cluster.calls):
                time.sleep(0.05)
            with cluster.lock:
                kernel(node).close_device(pid)
                cluster.pods["default/db-0"] = pod_doc("db-0", REPLACEMENT, "gpu-node-2",
                                                       owner="StatefulSet")

        helper = threading.Thread(target=recreate_elsewhere, daemon=True)
        helper.start()
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-timeout", "20")
        helper.join(timeout=5)
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        evictions = [s for s in cluster.steps() if s.startswith("evict:")]
        assert evictions == ["evict:db-0:429", "evict:db-0:409"]
        assert all(c.body["deleteOptions"]["preconditions"] == {"uid": UID}  # type: ignore[index]
                   for c in cluster.calls if c.path.endswith("/eviction"))
        survivor = cluster.pods["default/db-0"]["metadata"]
        assert survivor["uid"] == REPLACEMENT and "deletionTimestamp" not in survivor
        assert loaded(node) == V2
