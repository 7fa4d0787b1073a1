"""The pool's upgrade slots as coordination.k8s.io/v1 Leases, against the strict fake API
(tests/kubelease.py: resourceVersion conflicts, and a check that no Lease ever changes
holder before it was released or expired).

Slot by slot (installer.upgrade.lease), then in the live upgrade (taken before the cordon,
released after the uncordon, a held slot makes the node wait, an expired one is taken
over), then many installers deciding at once: 3 and 5 nodes started together, 50 trials
each, the fake answering every call after a random delay, the unavailable nodes counted
after every call. The concurrent installers run the live upgrade's guard and its Node
writes (`rollout.take_turn`, the cordon, the uncordon, `lease.release`) on threads of the
test process: a full install per node and trial would take hours. Whole installer
processes started together, fewer trials: tests/host/test_upgrade_lease_processes.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kubefake
import kubelease
import pytest
import requests
from e2e import Scene
from host import test_upgrade
from host.test_upgrade import NODE, UID, V2, cluster_with, kernel, loaded, pod_cgroup, upgrade
from kubefake import Cluster, node_doc, pod_doc

from installer.errors import UpgradeWaitingError
from installer.node import kube
from installer.upgrade import lease, rollout

repo, scene = test_upgrade.repo, test_upgrade.scene  # the fixtures: V1 serving, V1+V2 mirror
SLOT0 = f"{lease.PREFIX}0"
OURS = "gpu-node-installer/cordoned-by"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cluster, kube.ApiServer, str]]:
    """A pool of three Ready nodes on the fake, a client, and its URL."""
    (tmp_path / "token").write_text(kubefake.TOKEN)
    cluster = Cluster(node_name=NODE, nodes={
        n: node_doc(n, {rollout.MANAGED_LABEL: "1"}) for n in ("n1", "n2", "n3")})
    with kubefake.serve(cluster) as url:
        api = kube.api_server(url, tmp_path, {})
        assert api is not None
        yield cluster, api, url


def holder(cluster: Cluster, index: int = 0) -> str | None:
    return kubelease.holder(cluster.leases.get(f"default/{lease.PREFIX}{index}"))


class TestSlots:
    def test_one_of_two_takers_gets_a_new_slot(self, served: tuple[Cluster, kube.ApiServer,
                                                                   str]) -> None:
        cluster, api, _ = served
        first = lease.take(api, "default", 0, None, "n1")
        second = lease.take(api, "default", 0, None, "n2")  # it read the slot as absent too
        assert first is not None and second is None
        assert holder(cluster) == "n1"
        lease.release(first)
        assert holder(cluster) is None and cluster.errors == []

    def test_a_held_slot_is_not_taken_and_a_stale_read_loses(
            self, served: tuple[Cluster, kube.ApiServer, str]) -> None:
        cluster, api, _ = served
        mine = lease.take(api, "default", 0, None, "n1")
        assert mine is not None
        read = lease.read(api, "default", 1)[0]
        assert read is not None
        assert lease.take(api, "default", 0, read, "n2") is None  # held: not even tried
        lease.release(mine)  # a new resourceVersion: what n2 read is stale now
        stale = {**read, "spec": {"leaseDurationSeconds": 60}}  # as if free when read
        assert lease.take(api, "default", 0, stale, "n2") is None  # 409 Conflict
        assert holder(cluster) is None and cluster.errors == []
        fresh = lease.take(api, "default", 0, lease.read(api, "default", 1)[0], "n2")
        assert fresh is not None and holder(cluster) == "n2"
        lease.release(fresh)

    def test_an_expired_slot_is_taken_over_and_counted(
            self, served: tuple[Cluster, kube.ApiServer, str]) -> None:
        cluster, api, _ = served
        dead = lease.take(api, "default", 0, None, "n1")
        assert dead is not None
        dead.stop.set()  # the holder died: no renewal, no release
        kubelease.expire(cluster, SLOT0)
        taken = lease.take(api, "default", 0, lease.read(api, "default", 1)[0], "n2")
        assert taken is not None and holder(cluster) == "n2"
        assert cluster.leases[f"default/{SLOT0}"]["spec"]["leaseTransitions"] == 1
        assert cluster.errors == []
        lease.release(taken)

    def test_renewed_while_held_then_released(
            self, served: tuple[Cluster, kube.ApiServer, str],
            monkeypatch: pytest.MonkeyPatch) -> None:
        cluster, api, _ = served
        monkeypatch.setattr(lease, "RENEW_S", 0.05)
        slot = lease.take(api, "default", 0, None, "n1")
        assert slot is not None
        first = cluster.leases[f"default/{SLOT0}"]["spec"]["renewTime"]
        end = time.monotonic() + 5
        while cluster.leases[f"default/{SLOT0}"]["spec"]["renewTime"] == first:
            assert time.monotonic() < end, "never renewed"
            time.sleep(0.02)
        lease.release(slot)
        version = cluster.leases[f"default/{SLOT0}"]["metadata"]["resourceVersion"]
        time.sleep(0.2)
        assert cluster.leases[f"default/{SLOT0}"]["metadata"]["resourceVersion"] == version
        assert holder(cluster) is None and cluster.errors == []

    def test_the_fake_refuses_what_the_api_server_refuses(
            self, served: tuple[Cluster, kube.ApiServer, str]) -> None:
        _, api, url = served
        slot = lease.take(api, "default", 0, None, "n1")
        assert slot is not None
        path = f"{url}/apis/coordination.k8s.io/v1/namespaces/default/leases/{SLOT0}"
        headers = {"Authorization": f"Bearer {kubefake.TOKEN}"}
        doc = requests.get(path, headers=headers, timeout=5).json()
        unversioned = {**doc, "metadata": {"name": SLOT0, "namespace": "default"}}
        assert requests.put(path, json=unversioned, headers=headers, timeout=5
                            ).status_code == 422
        doc["spec"]["holderIdentity"] = "n2"
        doc["metadata"]["resourceVersion"] = "0"
        conflict = requests.put(path, json=doc, headers=headers, timeout=5)
        assert conflict.status_code == 409 and conflict.json()["reason"] == "Conflict"
        assert requests.post(path.rsplit("/", 1)[0], json=doc, headers=headers, timeout=5
                             ).json()["reason"] == "AlreadyExists"
        lease.release(slot)


class TestInTheUpgrade:
    def test_taken_before_the_cordon_released_after_the_uncordon(self, scene: tuple[Scene,
                                                                                     str]) -> None:
        node, mirror = scene
        pid = kernel(node).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(UID))
        cluster = cluster_with(node, pod_doc("train", UID, NODE), holders={"train": pid})
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        order = [f"{c.method} {'lease' if 'leases' in c.path else 'node'}"
                 f"{':cordoned' if c.unschedulable else ''}" for c in cluster.calls
                 if "leases" in c.path or c.method == "PATCH"]
        taken = order.index("POST lease")
        first_cordon = next(i for i, o in enumerate(order) if o.endswith(":cordoned"))
        last = max(i for i, o in enumerate(order) if o.startswith("PATCH"))
        assert taken < first_cordon and order[-1] == "PUT lease" and last < len(order) - 1
        assert holder(cluster) is None and loaded(node) == V2

    def test_a_held_slot_makes_it_wait_and_an_expired_one_is_taken_over(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        pid = kernel(node).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(UID))
        cluster = cluster_with(node, pod_doc("train", UID, NODE), holders={"train": pid})
        cluster.nodes["gpu-node-2"] = node_doc("gpu-node-2", {rollout.MANAGED_LABEL: "1"})
        with kubefake.serve(cluster) as url:
            other = self._take_as(url, node, "gpu-node-2")
            waited = upgrade(node, mirror, url, "--upgrade-timeout", "1")
            assert waited.returncode == UpgradeWaitingError.code, waited.stderr
            assert "gpu-node-2 (holds upgrade slot 0)" in waited.stderr
            assert cluster.node()["spec"].get("unschedulable") is None
            other.stop.set()  # gpu-node-2's installer died holding the slot
            kubelease.expire(cluster, SLOT0)
            done = upgrade(node, mirror, url)
        assert done.returncode == 0, done.stderr
        assert cluster.errors == [] and loaded(node) == V2
        assert cluster.leases[f"default/{SLOT0}"]["spec"]["leaseTransitions"] == 1

    @staticmethod
    def _take_as(url: str, node: Scene, who: str) -> lease.Slot:
        test_upgrade.account(node)
        api = kube.api_server(url, node.work / "serviceaccount", {})
        assert api is not None
        slot = lease.take(api, "default", 0, None, who)
        assert slot is not None
        return slot


class TestManyInstallers:
    """Never more nodes unavailable than the limit, counted after every call the fake
    answers; every installer ends upgraded, none stuck, every slot given back."""

    @pytest.mark.parametrize(("nodes", "limit"), [(3, "1"), (5, "2")])
    def test_started_together_with_random_delays(self, tmp_path: Path, nodes: int,
                                                 limit: str) -> None:
        (tmp_path / "token").write_text(kubefake.TOKEN)
        names = [f"n{i}" for i in range(nodes)]
        cluster = Cluster(node_name=names[0], jitter_s=0.004)
        seen: list[int] = []
        cluster.observe = lambda: seen.append(sum(  # type: ignore[func-returns-value]
            1 for n in cluster.nodes.values() if n["spec"].get("unschedulable"))) or ""
        with kubefake.serve(cluster) as url:
            api = kube.api_server(url, tmp_path, {})
            assert api is not None
            for trial in range(50):
                with cluster.lock:  # a fresh pool, no Lease yet
                    cluster.nodes = {n: node_doc(n, {rollout.MANAGED_LABEL: "1"})
                                     for n in names}
                    cluster.leases = {}
                    seen.clear()
                outcomes = _race(api, names, limit)
                assert outcomes == dict.fromkeys(names, "done"), f"trial {trial}: {outcomes}"
                assert cluster.errors == [], f"trial {trial}"
                assert max(seen) <= int(limit), f"trial {trial}: {max(seen)} unavailable"
                assert all(kubelease.holder(doc) is None for doc in cluster.leases.values())
                assert not any(n["spec"].get("unschedulable") for n in cluster.nodes.values())


def _race(api: kube.ApiServer, names: list[str], limit: str) -> dict[str, str]:
    """Each node's guard and Node writes on its own thread, all released at once."""
    start = threading.Barrier(len(names))
    outcomes: dict[str, str] = {}

    def installer(name: str) -> None:
        start.wait()
        try:
            slot = rollout.take_turn(api, name, limit, namespace="default",
                                     deadline=time.monotonic() + 30, interval=0.01)
            kube.patch_node(api, name, {"spec": {"unschedulable": True}, "metadata": {
                "labels": {kubefake.STATE: "cordon-required"},
                "annotations": {OURS: name}}})
            time.sleep(0.005)  # evictions, the unload, the install
            kube.patch_node(api, name, {"spec": {"unschedulable": None}, "metadata": {
                "labels": {kubefake.STATE: "upgrade-done"}, "annotations": {OURS: None}}})
            lease.release(slot)
            outcomes[name] = "done"
        except Exception as exc:  # the outcome names it
            outcomes[name] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=installer, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes

