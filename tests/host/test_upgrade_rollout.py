"""The pool limit across nodes, against the strict fake API: two (or three) nodes, each its
own host tree and installer process, sharing one cluster.

A refusal on one node must hold no other back (it touched nothing, so it does not count as
unavailable); a turn that does not come within UPGRADE_TIMEOUT is `upgrade-waiting` (exit
17, the node stays `upgrade-required`), not a failure; a node our upgrade cordoned holds its
slot and resumes without waiting for a turn. Each scene ends with the cause fixed and every
node upgraded by a rerun. Fixtures and helpers come from test_upgrade.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import kubefake
from e2e import Scene, make_scene
from host import test_upgrade
from host.test_upgrade import V1, V2, holding, install, kernel, loaded, upgrade
from kubefake import Cluster, node_doc, pod_doc

from installer.errors import UpgradeBlockedError, UpgradeTimeoutError, UpgradeWaitingError
from installer.upgrade import rollout

repo, scene = test_upgrade.repo, test_upgrade.scene  # the fixtures: V1 serving, V1+V2 mirror
Scenes = tuple[Scene, str]
N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"
UID1 = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
UID2 = "1b5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
STATE = kubefake.STATE
OURS = "gpu-node-installer/cordoned-by"


def second_node(tmp_path: Path, mirror: str) -> Scene:
    """Another node serving V1 (installed the ordinary way from the same mirror)."""
    base = tmp_path / "n2"
    base.mkdir()
    node = make_scene(base)
    first = install(node, mirror, V1)
    assert first.returncode == 0, first.stderr
    return node


def pool(*names: str) -> dict[str, dict[str, object]]:
    """Pool nodes (labelled as the installer labels the nodes it served)."""
    return {n: node_doc(n, {rollout.MANAGED_LABEL: V1}) for n in names}


def kubelet(holders: dict[str, tuple[Scene, int]]) -> Callable[[dict[str, object]], None]:
    """An evicted pod's process exits on its own node."""
    def stop(pod: dict[str, object]) -> None:
        found = holders.get(pod["metadata"]["name"])  # type: ignore[index]
        if found is not None:
            kernel(found[0]).close_device(found[1])
    return stop


def pool_cluster(n1: Scene, **pods: tuple[Scene, dict[str, object]]) -> Cluster:
    """Pool nodes N1 and N2 seen from N1, and `pods` (name: its node's scene, its document),
    each with a process on its node that holds the GPU and exits when the pod is evicted."""
    holders = {name: (node, holding(node, doc["metadata"]["uid"]))  # type: ignore[index]
               for name, (node, doc) in pods.items()}
    cluster = Cluster(node_name=N1, nodes=pool(N1, N2),
                      pods={f"default/{name}": doc for name, (_, doc) in pods.items()},
                      observe=lambda: loaded(n1))
    cluster.on_evict = kubelet(holders)
    return cluster


def live(node: Scene, name: str, mirror: str, api: str, *extra: str
         ) -> subprocess.CompletedProcess[str]:
    """The upgrade on the pool node `name`."""
    return upgrade(node, mirror, api, *extra, name=name)


def state(cluster: Cluster, name: str) -> str | None:
    return cluster.nodes[name]["metadata"]["labels"].get(STATE)  # type: ignore[no-any-return]


def cordoned(cluster: Cluster, name: str) -> bool:
    return cluster.nodes[name]["spec"].get("unschedulable") is True


def reasons_on(cluster: Cluster, name: str) -> list[str]:
    return [e["reason"] for e in cluster.events if e["involvedObject"]["name"] == name]


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


class TestNoDeadlock:
    def test_a_refusal_on_one_node_holds_no_other_and_both_finish_once_fixed(
            self, scene: Scenes, tmp_path: Path) -> None:
        """Node 1 refuses a bare pod (touching nothing). Node 2, labelled upgrade-failed
        by an earlier run whose wait timed out (untouched too), is not held back by it,
        and node 1's rerun with the cause fixed is not held back by node 2."""
        n1, mirror = scene
        n2 = second_node(tmp_path, mirror)
        cluster = pool_cluster(n1, bare=(n1, pod_doc("bare", UID1, N1, owner=None)),
                               train=(n2, pod_doc("train", UID2, N2)))
        cluster.nodes[N2]["metadata"]["labels"][STATE] = "upgrade-failed"  # type: ignore[index]
        with kubefake.serve(cluster) as api:
            refused = live(n1, N1, mirror, api)
            assert refused.returncode == UpgradeBlockedError.code, refused.stderr
            assert "pod default/bare" in last_line(refused)
            assert state(cluster, N1) == "upgrade-failed" and not cordoned(cluster, N1)
            second = live(n2, N2, mirror, api, "--upgrade-timeout", "10")
            assert second.returncode == 0, second.stderr
            assert state(cluster, N2) == "upgrade-done" and loaded(n2) == V2
            fixed = live(n1, N1, mirror, api, "--upgrade-force", "--upgrade-timeout", "10")
        assert fixed.returncode == 0, fixed.stderr
        assert cluster.errors == []
        assert loaded(n1) == V2 and state(cluster, N1) == "upgrade-done"
        assert not cordoned(cluster, N1) and not cordoned(cluster, N2)
        assert cluster.pods == {}

    def test_a_turn_that_times_out_is_waiting_not_failed_and_a_rerun_finishes(
            self, scene: Scenes, tmp_path: Path) -> None:
        """Node 1 is cordoned mid-upgrade (a PodDisruptionBudget refuses). Node 2's turn
        does not come: exit 17, still upgrade-required, nothing touched, told why. Once the
        budget allows, node 1 resumes, then node 2's rerun finishes."""
        n1, mirror = scene
        n2 = second_node(tmp_path, mirror)
        cluster = pool_cluster(n1, db=(n1, pod_doc("db", UID1, N1)),
                               train=(n2, pod_doc("train", UID2, N2)))
        cluster.evictions["default/db"] = [429] * 1000
        with kubefake.serve(cluster) as api:
            stuck = live(n1, N1, mirror, api, "--upgrade-timeout", "2")
            assert stuck.returncode == UpgradeTimeoutError.code, stuck.stderr
            assert cordoned(cluster, N1) and state(cluster, N1) == "upgrade-failed"
            waited = live(n2, N2, mirror, api, "--upgrade-timeout", "1")
            assert waited.returncode == UpgradeWaitingError.code, waited.stderr
            line = last_line(waited)
            assert line.startswith("error(upgrade-waiting)")
            assert (f"1 other node(s) are unavailable or upgrading: {N1} (upgrade-failed, "
                    "cordoned)") in line
            assert "this node was not cordoned and no pod was evicted" in line
            assert state(cluster, N2) == "upgrade-required" and not cordoned(cluster, N2)
            assert "default/train" in cluster.pods and loaded(n2) == V1
            assert "DriverUpgradeWaiting" in reasons_on(cluster, N2)
            assert "DriverUpgradeFailed" not in reasons_on(cluster, N2)
            cluster.evictions["default/db"] = []
            resumed = live(n1, N1, mirror, api, "--upgrade-timeout", "10")
            assert resumed.returncode == 0, resumed.stderr
            rerun = live(n2, N2, mirror, api, "--upgrade-timeout", "10")
        assert rerun.returncode == 0, rerun.stderr
        assert cluster.errors == []
        assert loaded(n1) == V2 and loaded(n2) == V2
        assert [state(cluster, n) for n in (N1, N2)] == ["upgrade-done"] * 2
        assert not cordoned(cluster, N1) and not cordoned(cluster, N2)


class TestResume:
    def test_a_node_cordoned_by_our_upgrade_resumes_while_another_is_not_ready(
            self, scene: Scenes) -> None:
        """It holds its slot already: a NotReady pool node does not make it wait."""
        n1, mirror = scene
        cluster = pool_cluster(n1, db=(n1, pod_doc("db", UID1, N1)))
        cluster.evictions["default/db"] = [429] * 1000
        with kubefake.serve(cluster) as api:
            stuck = live(n1, N1, mirror, api, "--upgrade-timeout", "2")
            assert stuck.returncode == UpgradeTimeoutError.code, stuck.stderr
            assert cordoned(cluster, N1) and OURS in cluster.node()["metadata"]["annotations"]
            cluster.nodes[N3] = node_doc(N3, {rollout.MANAGED_LABEL: V1}, ready=False)
            cluster.evictions["default/db"] = []
            resumed = live(n1, N1, mirror, api, "--upgrade-timeout", "10")
        assert resumed.returncode == 0, resumed.stderr
        assert "nothing was cordoned" not in resumed.stderr
        assert loaded(n1) == V2 and state(cluster, N1) == "upgrade-done"
        assert not cordoned(cluster, N1)
        assert "DriverUpgradeResumed" in reasons_on(cluster, N1)
        assert cluster.errors == []

    def test_a_refusal_on_resume_says_the_node_stays_cordoned_and_a_fixed_rerun_finishes(
            self, scene: Scenes) -> None:
        """Our cordon stands from an earlier run; a bare pod now holds the GPU: refused
        (exit 15) saying what really happened (still cordoned, nothing unloaded), never
        "nothing was cordoned"; the cordon stays; with the cause fixed the rerun ends."""
        n1, mirror = scene
        pids = {"bare": (n1, holding(n1, UID1))}
        standing = node_doc(N1, {rollout.MANAGED_LABEL: V1, STATE: "upgrade-failed"},
                            cordoned=True)
        standing["metadata"]["annotations"] = {OURS: "installer-pod"}  # type: ignore[index]
        cluster = Cluster(node_name=N1, nodes={
            N1: standing, N2: node_doc(N2, {rollout.MANAGED_LABEL: V1}, ready=False)},
            pods={"default/bare": pod_doc("bare", UID1, N1, owner=None)},
            observe=lambda: loaded(n1))
        cluster.on_evict = kubelet(pids)
        with kubefake.serve(cluster) as api:
            refused = live(n1, N1, mirror, api, "--upgrade-timeout", "10")
            assert refused.returncode == UpgradeBlockedError.code, refused.stderr
            line = last_line(refused)
            assert "pod default/bare" in line and "nothing was cordoned" not in line
            assert "the node stays cordoned by this upgrade" in line
            assert "nothing was unloaded" in line
            assert cordoned(cluster, N1) and loaded(n1) == V1
            assert "default/bare" in cluster.pods
            fixed = live(n1, N1, mirror, api, "--upgrade-force", "--upgrade-timeout", "10")
        assert fixed.returncode == 0, fixed.stderr
        assert "DriverUpgradeResumed" in reasons_on(cluster, N1)
        assert loaded(n1) == V2 and state(cluster, N1) == "upgrade-done"
        assert not cordoned(cluster, N1) and cluster.errors == []

    def test_only_our_standing_cordon_holds_the_slot(self) -> None:
        ours = {OURS: "installer-pod"}
        standing = node_doc(N1, cordoned=True)
        standing["metadata"]["annotations"] = ours
        lifted = node_doc(N1)  # our annotation outlived a manual uncordon
        lifted["metadata"]["annotations"] = ours
        assert rollout.holds_slot(standing)
        assert not rollout.holds_slot(lifted)
        assert not rollout.holds_slot(node_doc(N1, cordoned=True))  # someone else's
        assert not rollout.holds_slot(node_doc(N1))
