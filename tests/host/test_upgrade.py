"""Driver upgrades on a live node: `install` with UPGRADE_POLICY=evict/drain
against the strict fake API server (tests/kubefake.py), over a host tree whose simulated
kernel is shared by the test and the installer process (tests/fakenode.py).

Each test installs V1, starts a "GPU process" holding /dev/nvidia0 in a pod-shaped cgroup,
then installs V2. The fake API server plays kubelet: when the pod is evicted, the process
exits. The server records every call with the Node's upgrade state and the driver the
kernel had loaded at that instant, so the order (cordon, evictions, unload, install,
validation, uncordon) is asserted from what the cluster and the kernel saw.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from e2e import Scene, add_version, events, make_scene, run_cli, standin_env
from httpserver import MirrorServer
from kubefake import Cluster, node_doc, pod_doc

from installer.errors import (
    ModuleInUseError,
    UpgradeBlockedError,
    UpgradeTimeoutError,
    UpgradeWaitingError,
)
from installer.node.host import Roots
from installer.testing.kernel import FakeKernelHost

V1, V2 = "535.261.03", "535.309.01"
NODE = "gpu-node-1"
UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
DS_UID = "9f8e7d6c-5b4a-4321-8fed-cba987654321"
CID = "4f1e7c0b6d5a3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"


def pod_cgroup(uid: str) -> str:
    """A cgroup v2 line as containerd under the systemd driver writes it."""
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """V1 and V2 packages, built once for the module (the builds dominate the run time)."""
    base = tmp_path_factory.mktemp("upgrade-repo")
    scene = make_scene(base)
    add_version(scene, V1)
    add_version(scene, V2)
    return scene.repo


@pytest.fixture
def scene(tmp_path: Path, repo: Path) -> Iterator[tuple[Scene, str]]:
    """A node serving V1 (installed the ordinary way), and a mirror holding V1 and V2."""
    scene = make_scene(tmp_path)
    with MirrorServer(repo) as mirror:
        first = install(scene, mirror.url, V1)
        assert first.returncode == 0, first.stderr
        yield scene, mirror.url


def kernel(scene: Scene) -> FakeKernelHost:
    """The simulated kernel as the installer sees it (its state lives in the tree)."""
    root = scene.root
    return FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def loaded(scene: Scene) -> str:
    """The loaded version; read once, as the fake kernel may swap the file meanwhile."""
    try:
        text = (scene.root / "proc/driver/nvidia/version").read_text()
    except FileNotFoundError:
        text = ""
    return next((v for v in (V1, V2) if v in text), "none")


def account(scene: Scene) -> Path:
    directory = scene.work / "serviceaccount"
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text(kubefake.TOKEN + "\n")
    return directory


def install(scene: Scene, mirror: str, version: str, *extra: str
            ) -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", version,
                                           "--allow-http", "--output", "json", *extra)],
                   standin_env(version))


def upgrade(scene: Scene, mirror: str, api: str, *extra: str, policy: str = "evict",
            name: str = NODE) -> subprocess.CompletedProcess[str]:
    """A live upgrade to V2 of node `name` under `policy`, against the API server at `api`."""
    return install(scene, mirror, V2, "--upgrade-policy", policy, "--node-name", name,
                   "--kube-api", api, "--service-account-dir", str(account(scene)), *extra)


def holding(scene: Scene, uid: str, comm: str = "python3") -> int:
    """A process of pod `uid` with /dev/nvidia0 open; returns its PID."""
    return kernel(scene).open_device("nvidia", "/dev/nvidia0", comm, pod_cgroup(uid))


def training(scene: Scene) -> tuple[Cluster, int]:
    """A training pod holding the GPU (evicting it ends the process): the cluster, the PID."""
    pid = holding(scene, UID)
    return cluster_with(scene, pod_doc("train", UID, NODE), holders={"train": pid}), pid


def evicting(scene: Scene, mirror: str, answers: list[int], *extra: str
             ) -> tuple[Cluster, subprocess.CompletedProcess[str]]:
    """An upgrade while the training pod's evictions are answered `answers` in turn, then
    allowed (a PodDisruptionBudget's way); the cluster and the run."""
    cluster, _ = training(scene)
    cluster.evictions["default/train"] = answers
    with kubefake.serve(cluster) as api:
        done = upgrade(scene, mirror, api, *extra)
    return cluster, done


def untouched(cluster: Cluster, scene: Scene) -> None:
    """Nothing but the upgrade-state label moved: no cordon, eviction or delete, V1 loaded."""
    assert [s for s in cluster.steps() if not s.startswith("patch:upgrade-")] == []
    assert cluster.node()["spec"].get("unschedulable") is None
    assert cluster.errors == []
    assert loaded(scene) == V1


def cluster_with(scene: Scene, *pods: dict[str, object],
                 holders: dict[str, int] | None = None) -> Cluster:
    """The node and `pods`; evicting a pod named in `holders` ends that process."""
    cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                      pods={f"{p['metadata']['namespace']}/{p['metadata']['name']}": p  # type: ignore[index]
                            for p in pods},
                      observe=lambda: loaded(scene))

    def kubelet(pod: dict[str, object]) -> None:
        pid = (holders or {}).get(pod["metadata"]["name"])  # type: ignore[index]
        if pid is not None:
            kernel(scene).close_device(pid)

    cluster.on_evict = kubelet
    return cluster


def reasons(cluster: Cluster) -> list[str]:
    return [e["reason"] for e in cluster.events]


class TestEvict:
    def test_cordon_evict_unload_install_validate_uncordon(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        bystander = pod_doc("web", "11111111-2222-4333-8444-555555555555", NODE)
        cluster = cluster_with(node, pod_doc("train", UID, NODE), bystander,
                               holders={"train": pid})
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-grace-period", "30")
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        assert cluster.states() == ["upgrade-required", "cordon-required",
                                    "pod-deletion-required", "validation-required",
                                    "uncordon-required", "upgrade-done"]
        # what the cluster and the kernel saw, in order: V1 serves until the pod is gone
        steps = [(s, c.observed) for s, c in zip(cluster.steps(), _changing(cluster),
                                                  strict=True)]
        assert steps == [
            ("patch:upgrade-required:-", V1), ("patch:cordon-required:-", V1),
            ("patch:cordon-required:cordoned", V1), ("patch:pod-deletion-required:cordoned", V1),
            ("evict:train:201", V1), ("patch:validation-required:cordoned", V1),
            ("patch:validation-required:cordoned", V2),  # signal's labels: V2 verified
            ("patch:uncordon-required:cordoned", V2), ("patch:upgrade-done:-", V2)]
        eviction = next(c for c in cluster.calls if c.path.endswith("/eviction"))
        assert eviction.body == {"apiVersion": "policy/v1", "kind": "Eviction",
                                 "metadata": {"name": "train", "namespace": "default"},
                                 "deleteOptions": {"gracePeriodSeconds": 30,
                                                   "preconditions": {"uid": UID}}}
        assert "default/web" in cluster.pods  # evict touches only the pods holding GPUs
        final = cluster.node()
        assert "unschedulable" not in final["spec"]
        assert "gpu-node-installer/cordoned-by" not in final["metadata"].get("annotations", {})
        assert final["metadata"]["labels"]["gpu-node-installer/driver-version"] == V2
        assert reasons(cluster) == ["DriverUpgradeRequired", "DriverUpgradeCordoned",
                                    "DriverUpgradeEvicted", "DriverUpgradeGpusFreed",
                                    "DriverReady", "DriverUpgradeDone"]
        steps_logged = [e["step"] for e in events(done.stderr) if e["event"] == "upgrade step"]
        assert steps_logged == ["upgrade-required", "cordon-required", "pod-deletion-required",
                                "uncordon-required"]
        assert all("duration_ms" in e for e in events(done.stderr)
                   if e["event"] == "upgrade step")
        assert loaded(node) == V2

    def test_same_version_restart_is_the_fast_path_and_evicts_nothing(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        holding(node, UID)
        cluster = cluster_with(node, pod_doc("train", UID, NODE))
        with kubefake.serve(cluster) as api:
            done = install(node, mirror, V1, "--upgrade-policy", "evict", "--node-name", NODE,
                           "--kube-api", api, "--service-account-dir", str(account(node)))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["fast_path"] is True
        assert cluster.steps() == ["patch:-:-"]  # signal's labels only
        assert cluster.states() == []
        assert "default/train" in cluster.pods

    def test_a_pdb_that_never_allows_times_out_cordoned_with_v1_serving(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, done = evicting(node, mirror, [429] * 1000, "--upgrade-timeout", "1")
        assert done.returncode == UpgradeTimeoutError.code, done.stderr
        assert "error(upgrade-timeout)" in done.stderr and "default/train" in done.stderr
        assert cluster.errors == []
        assert cluster.node()["spec"]["unschedulable"] is True
        assert cluster.node()["metadata"]["labels"]["gpu-node-installer/upgrade-state"] \
            == "upgrade-failed"
        failed = [e for e in cluster.events if e["reason"] == "DriverUpgradeFailed"]
        assert len(failed) == 1 and failed[0]["type"] == "Warning"
        assert "PodDisruptionBudget" in failed[0]["message"]
        assert "stays cordoned" in failed[0]["message"]
        assert "DriverUpgradeEvictionRefused" in reasons(cluster)
        assert all(c.observed == V1 for c in cluster.calls)
        assert loaded(node) == V1
        ready = json.loads((node.install_dir / ".ready.json").read_text())
        assert ready["driver_version"] == V1  # the old driver was declared ready again

    def test_the_next_run_resumes_and_uncordons(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _ = training(node)
        cluster.evictions["default/train"] = [429] * 1000  # the first run cannot finish
        with kubefake.serve(cluster) as api:
            # long enough to cordon on a loaded machine; the eviction never comes
            assert upgrade(node, mirror, api, "--upgrade-timeout", "2").returncode == 16
            assert cluster.node()["spec"]["unschedulable"] is True
            cluster.evictions["default/train"] = [429] * 3
            done = upgrade(node, mirror, api, "--upgrade-timeout", "30")
        assert done.returncode == 0, done.stderr
        assert "unschedulable" not in cluster.node()["spec"]
        assert cluster.states()[-1] == "upgrade-done"
        assert loaded(node) == V2

    def test_a_429_then_201_is_retried(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, done = evicting(node, mirror, [429, 429], "--upgrade-timeout", "20")
        assert done.returncode == 0, done.stderr
        evictions = [s for s in cluster.steps() if s.startswith("evict:")]
        assert evictions == ["evict:train:429", "evict:train:429", "evict:train:201"]

    def test_a_node_cordoned_by_someone_else_stays_cordoned(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _ = training(node)
        cluster.node()["spec"]["unschedulable"] = True
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert cluster.node()["spec"]["unschedulable"] is True
        assert cluster.states()[-1] == "upgrade-done"
        assert loaded(node) == V2


    def test_our_annotation_without_the_cordon_cordons_again(
            self, scene: tuple[Scene, str]) -> None:
        """Someone uncordoned by hand after a failed run: the next run cordons before
        evicting, and uncordons after."""
        node, mirror = scene
        cluster, _ = training(node)
        cluster.node()["metadata"]["annotations"] = {"gpu-node-installer/cordoned-by": "old"}
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        steps = cluster.steps()
        assert steps.index("patch:cordon-required:cordoned") < steps.index("evict:train:201")
        assert "unschedulable" not in cluster.node()["spec"]


class TestBlocked:
    def test_a_process_outside_any_pod_is_named_and_never_touched(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        pid = kernel(node).open_device("nvidia", "/dev/nvidia0", "nvidia-smi",
                                       "0::/system.slice/monitoring.service\n")
        cluster = cluster_with(node, pod_doc("train", UID, NODE))
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == UpgradeBlockedError.code, done.stderr
        assert f"process {pid} (nvidia-smi) is not in a pod" in done.stderr
        assert (node.root / "proc" / str(pid)).exists()
        untouched(cluster, node)
        assert cluster.states() == ["upgrade-required", "upgrade-failed"]

    def test_a_gpu_daemonset_pod_blocks_unless_restarts_are_allowed(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        pid = holding(node, DS_UID, "dcgm-exporter")
        exporter = pod_doc("dcgm-exporter-x1", DS_UID, NODE, namespace="monitoring",
                           owner="DaemonSet")
        cluster = cluster_with(node, exporter, holders={"dcgm-exporter-x1": pid})
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api)
            assert blocked.returncode == UpgradeBlockedError.code
            assert "UPGRADE_RESTART_DAEMONSETS=true" in blocked.stderr
            untouched(cluster, node)
            done = upgrade(node, mirror, api, "--upgrade-restart-daemonsets")
        assert done.returncode == 0, done.stderr
        deletes = [c for c in cluster.calls if c.method == "DELETE"]
        assert len(deletes) == 1 and deletes[0].body == {
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": DS_UID}}
        assert loaded(node) == V2

    def test_in_use_with_no_visible_holder_cordons_nothing(
            self, scene: tuple[Scene, str]) -> None:
        """A user /proc does not show (another PID namespace): evicting could not help."""
        import shutil

        node, mirror = scene
        pid = holding(node, UID)
        shutil.rmtree(node.root / "proc" / str(pid))  # the reference stays, the process hides
        cluster = cluster_with(node, pod_doc("train", UID, NODE))
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == UpgradeBlockedError.code, done.stderr
        assert "no process in this PID namespace" in done.stderr and "hostPID" in done.stderr
        assert "[upgrade]" in done.stderr
        untouched(cluster, node)

    def test_the_skip_label_keeps_the_busy_driver(self, scene: tuple[Scene, str]) -> None:
        """The label does not refuse (exit 10, a crash-looping pod): the node
        keeps serving its driver, labelled upgrade-skipped (tests/host/test_upgrade_skip.py)."""
        node, mirror = scene
        cluster, _ = training(node)
        cluster.node()["metadata"]["labels"]["gpu-node-installer/upgrade.skip"] = "true"
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert cluster.steps() == ["patch:upgrade-skipped:-"]
        assert reasons(cluster) == ["DriverUpgradeSkipped"]
        assert "default/train" in cluster.pods and loaded(node) == V1

    def test_refuse_policy_keeps_todays_behaviour(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        holding(node, UID)
        done = install(node, mirror, V2)
        assert done.returncode == ModuleInUseError.code and loaded(node) == V1


class TestDrain:
    def test_drain_evicts_every_non_daemonset_pod(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        pid = holding(node, UID)
        pods = [pod_doc("train", UID, NODE),
                pod_doc("web", "11111111-2222-4333-8444-555555555555", NODE),
                pod_doc("fluentd-a", "21111111-2222-4333-8444-555555555555", NODE,
                        owner="DaemonSet"),
                pod_doc("done-job", "31111111-2222-4333-8444-555555555555", NODE,
                        owner="Job", phase="Succeeded"),
                pod_doc("kube-proxy-n1", "41111111-2222-4333-8444-555555555555", NODE,
                        owner="Node", annotations={"kubernetes.io/config.mirror": "abc"})]
        cluster = cluster_with(node, *pods, holders={"train": pid})
        with kubefake.serve(cluster) as api:
            done = install(node, mirror, V2, "--upgrade-policy", "drain", "--node-name", NODE,
                           "--kube-api", api, "--service-account-dir", str(account(node)))
        assert done.returncode == 0, done.stderr
        evicted = sorted(s for s in cluster.steps() if s.startswith("evict:"))
        assert evicted == ["evict:train:201", "evict:web:201"]
        assert sorted(cluster.pods) == ["default/done-job", "default/fluentd-a",
                                        "default/kube-proxy-n1"]
        assert loaded(node) == V2


def _changing(cluster: Cluster) -> list[kubefake.Call]:
    """The calls `Cluster.steps` names, in the same order."""
    return [c for c in cluster.calls
            if c.method in ("PATCH", "DELETE") or c.path.endswith("/eviction")]


class TestRollout:
    def test_waits_while_max_unavailable_other_nodes_upgrade(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _ = training(node)
        cluster.nodes["gpu-node-2"] = node_doc("gpu-node-2", {kubefake.STATE:
                                                              "pod-deletion-required"})
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-timeout", "0.5")
            assert done.returncode == UpgradeWaitingError.code, done.stderr
            assert "gpu-node-2" in done.stderr and "was not cordoned" in done.stderr
            assert cluster.states() == ["upgrade-required"]  # waiting is no failure
            assert cluster.node()["spec"].get("unschedulable") is None
            assert "default/train" in cluster.pods
            wider = upgrade(node, mirror, api, "--upgrade-max-unavailable", "2")
        assert wider.returncode == 0, wider.stderr
        assert loaded(node) == V2
