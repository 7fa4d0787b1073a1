"""GPU DaemonSets during a live upgrade, against the strict fake API.

The fake's DaemonSet controller recreates a deleted pod (new UID, same owner) and removes a
pod whose node labels stop matching; the fake "kubelet" starts the new pod's process. GKE's
device plugin is played as its start-up is written (cmd/nvidia_gpu): poll until
/dev/nvidiactl and /dev/nvidia-uvm exist, then open the driver. gpu-operator's components
are DaemonSets selecting on `nvidia.com/gpu.deploy.<component>=true` that open the driver
as soon as they start. Helpers and fixtures come from test_upgrade.py (same scene).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from subprocess import CompletedProcess

import host.test_upgrade as base
import kubefake
from e2e import Scene
from host.test_upgrade import (
    DS_UID,
    NODE,
    UID,
    V1,
    V2,
    _changing,
    kernel,
    loaded,
    pod_cgroup,
    reasons,
    upgrade,
)
from kubefake import Cluster, DaemonSet, add_daemonset, node_doc, pod_doc

from installer.errors import UpgradeTimeoutError
from installer.stages.load.devnodes import GATE

repo, scene = base.repo, base.scene  # the same fixtures: a node serving V1, a mirror
PLUGIN = ("kube-system", "nvidia-gpu-device-plugin")
DEPLOY = "nvidia.com/gpu.deploy."
OPERATOR_LABELS = {f"{DEPLOY}device-plugin": "true", f"{DEPLOY}dcgm-exporter": "true",
                   f"{DEPLOY}gpu-feature-discovery": "false", f"{DEPLOY}driver": "true",
                   "nvidia.com/gpu.present": "true"}


class Kubelet:
    """The node's processes per pod: stops a removed pod's process, starts a new pod's."""

    def __init__(self, node: Scene) -> None:
        self.node = node
        self.pids: dict[str, int] = {}
        self.lock = threading.Lock()

    def run(self, pod: dict[str, object], comm: str) -> None:
        meta = pod["metadata"]
        with self.lock:  # one writer of the fake kernel's files at a time in this process
            self.pids[meta["name"]] = kernel(self.node).open_device(  # type: ignore[index]
                "nvidia", "/dev/nvidiactl", comm, pod_cgroup(meta["uid"]))  # type: ignore[index]

    def stop(self, pod: dict[str, object]) -> None:
        with self.lock:
            pid = self.pids.pop(pod["metadata"]["name"], None)  # type: ignore[index]
            if pid is not None:
                kernel(self.node).close_device(pid)


class GkeDevicePlugin:
    """A new device-plugin pod: stat the two device files until both exist (GKE polls
    every 5 s; 20 ms here), then open NVML (/dev/nvidiactl) and record what it found."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.saw: list[dict[str, object]] = []
        self.threads: list[threading.Thread] = []
        self.stopped = threading.Event()
        # set once the installer process has exited: the fake kernel's state is files two
        # processes would rewrite at once (a real kernel has no such race)
        self.installer_done = threading.Event()

    def start(self, pod: dict[str, object]) -> None:
        """Its first look is at once; then it polls on its own thread."""
        if self._gate_open():
            self._open(pod)
            return
        thread = threading.Thread(target=self._wait, args=(pod,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _gate_open(self) -> bool:
        dev = self.kubelet.node.root / "dev"
        return (dev / "nvidiactl").exists() and (dev / "nvidia-uvm").exists()

    def _wait(self, pod: dict[str, object]) -> None:
        while not self._gate_open():
            if self.stopped.wait(0.02):
                return
        self._open(pod, after=self.installer_done)

    def _open(self, pod: dict[str, object], after: threading.Event | None = None) -> None:
        ready = self.kubelet.node.install_dir / ".ready.json"
        driver = loaded(self.kubelet.node)
        for _ in range(50):  # the fake kernel rewrites its state files in place: a reader
            if driver != "none":  # can land in between (an open gate means a driver is
                break  # loaded on a real kernel), so look again for up to a second
            time.sleep(0.02)
            driver = loaded(self.kubelet.node)
        self.saw.append({"pod": pod["metadata"]["name"],  # type: ignore[index]
                         "driver": driver,
                         "ready": json.loads(ready.read_text())["driver_version"]
                         if ready.exists() else None})
        if after is None or after.wait(30):
            self.kubelet.run(pod, "nvidia-gpu-devi")

    def join(self) -> None:
        self.installer_done.set()
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=30)


def plugin_cluster(node: Scene, kubelet: Kubelet, start: Callable[[dict[str, object]], None]
                   ) -> tuple[Cluster, DaemonSet]:
    """GKE's device plugin running on the node, holding V1 (its pod holds /dev/nvidiactl)."""
    cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                      observe=lambda: f"{loaded(node)} uvm="
                                      f"{(node.root / 'dev/nvidia-uvm').exists()}")
    daemonset = DaemonSet(*PLUGIN, recreate_after=0, on_create=start)  # back at once
    kubelet.run(add_daemonset(cluster, daemonset, uid=DS_UID), "nvidia-gpu-devi")
    cluster.on_evict = kubelet.stop
    return cluster, daemonset


def upgrade_beside_plugin(node: Scene, mirror: str, timeout: str
                          ) -> tuple[CompletedProcess[str], Cluster, DaemonSet,
                                     GkeDevicePlugin]:
    """Upgrade to V2 with GKE's device plugin holding V1 and deleted along the way; once
    the installer has exited, wait (bounded) for a held replacement to pass its gate."""
    kubelet = Kubelet(node)
    plugin = GkeDevicePlugin(kubelet)
    cluster, daemonset = plugin_cluster(node, kubelet, plugin.start)
    with kubefake.serve(cluster) as api:
        done = upgrade(node, mirror, api, "--upgrade-restart-daemonsets",
                       "--upgrade-timeout", timeout)
        plugin.installer_done.set()
        deadline = time.monotonic() + 30
        while done.returncode == 0 and not plugin.saw and time.monotonic() < deadline:
            time.sleep(0.05)
    plugin.join()
    return done, cluster, daemonset, plugin


class TestDevicePluginGate:
    def test_the_recreated_plugin_waits_at_its_gate_until_v2_is_verified(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        done, cluster, daemonset, plugin = upgrade_beside_plugin(node, mirror, "20")
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        assert cluster.states()[-1] == "upgrade-done"
        # the replacement came at once, but passed its gate only with V2 loaded and ready
        assert len(daemonset.made) == 2
        assert plugin.saw == [{"pod": daemonset.made[1], "driver": V2, "ready": V2}]
        # what the cluster saw: the gate closed from the deletion until V2 was verified
        seen = [(s, c.observed) for s, c in zip(cluster.steps(), _changing(cluster),
                                                 strict=True)]
        deleted = seen.index((f"delete:{daemonset.made[0]}:200", f"{V1} uvm=False"))
        signalled = seen.index(("patch:validation-required:cordoned", f"{V2} uvm=False"))
        assert deleted < signalled
        assert seen[-1] == ("patch:upgrade-done:-", f"{V2} uvm=True")
        assert reasons(cluster).index("DriverUpgradeGateHeld") \
            < reasons(cluster).index("DriverReady") \
            < reasons(cluster).index("DriverUpgradeGateOpened") \
            < reasons(cluster).index("DriverUpgradeDone")
        assert all((node.root / "dev" / name).exists() for name in GATE)
        assert loaded(node) == V2

    def test_a_plugin_that_keeps_coming_back_is_named_and_others_nodes_stay(
            self, scene: tuple[Scene, str]) -> None:
        """The gate's nodes were made by someone else (nvidia-modprobe, say): the installer
        never removes them, so the recreated plugin opens V1 again and is named."""
        node, mirror = scene
        for name in GATE:  # replaced by another tool: same numbers, a new inode
            path = node.root / "dev" / name
            other = path.with_name(f".{name}.other")
            other.write_text(path.read_text())
            os.replace(other, path)
        done, cluster, daemonset, plugin = upgrade_beside_plugin(node, mirror, "3")
        assert done.returncode == UpgradeTimeoutError.code, done.stderr
        back = f"{PLUGIN[0]}/{daemonset.made[1]}"
        assert f"in pod {back}, which DaemonSet {PLUGIN[0]}/{PLUGIN[1]} recreated after " \
               "its pod was deleted" in done.stderr
        # readiness stays while V1 serves (withdrawn only at the unload)
        assert plugin.saw == [{"pod": daemonset.made[1], "driver": V1, "ready": V1}]
        assert all((node.root / "dev" / name).exists() for name in GATE)
        assert "DriverUpgradeGateHeld" not in reasons(cluster)
        assert cluster.states()[-1] == "upgrade-failed" and loaded(node) == V1


class TestOperatorPause:
    def _operator(self, node: Scene, cluster: Cluster, kubelet: Kubelet) -> list[DaemonSet]:
        """gpu-operator's device plugin and dcgm-exporter, each holding V1 now and opening
        the driver at once when they start again."""
        sets = []
        for name, component, uid in (("nvidia-device-plugin-daemonset", "device-plugin",
                                      DS_UID),
                                     ("nvidia-dcgm-exporter", "dcgm-exporter",
                                      "7e8d7c6b-5a49-4382-9716-152433445566")):
            daemonset = DaemonSet("gpu-operator", name, {f"{DEPLOY}{component}": "true"},
                                  on_create=lambda pod, n=name: kubelet.run(pod, n[:15]))
            kubelet.run(add_daemonset(cluster, daemonset, uid=uid), name[:15])
            sets.append(daemonset)
        cluster.on_evict = kubelet.stop
        return sets

    def test_paused_then_restored_with_their_old_values(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        kubelet = Kubelet(node)
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE, OPERATOR_LABELS)},
                          observe=lambda: loaded(node))
        sets = self._operator(node, cluster, kubelet)
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-pause-operator")
            time.sleep(0.5)  # the controller's recreation after the restore
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        labels = cluster.node()["metadata"]["labels"]
        assert {k: labels[k] for k in OPERATOR_LABELS} == OPERATOR_LABELS
        assert "gpu-node-installer/paused-labels" not in cluster.node()["metadata"].get(
            "annotations", {})
        patches = [(c.body, c.observed) for c in cluster.calls if c.method == "PATCH"]
        paused = [o for b, o in patches if b and b["metadata"].get("labels", {}).get(
            f"{DEPLOY}device-plugin") == "paused-for-driver-upgrade"]
        restored = [o for b, o in patches if b and b["metadata"].get("labels", {}).get(
            f"{DEPLOY}device-plugin") == "true"]
        assert paused == [V1] and restored == [V2]
        pause_body = next(b for b, _ in patches
                          if b and "gpu-node-installer/paused-labels" in b["metadata"].get(
                              "annotations", {}))
        assert pause_body["metadata"]["labels"] == {
            f"{DEPLOY}dcgm-exporter": "paused-for-driver-upgrade",
            f"{DEPLOY}device-plugin": "paused-for-driver-upgrade"}  # only the `true` ones
        assert [c for c in cluster.calls if c.method == "DELETE"] == []  # the pause did it
        assert [len(d.made) for d in sets] == [2, 2]  # gone during, back after
        assert cluster.states()[-1] == "upgrade-done" and loaded(node) == V2
        assert "DriverUpgradeOperatorPaused" in reasons(cluster)
        assert reasons(cluster).index("DriverReady") \
            < reasons(cluster).index("DriverUpgradeOperatorResumed")

    def test_restored_when_the_upgrade_fails(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        kubelet = Kubelet(node)
        train = pod_doc("train", UID, NODE)
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE, OPERATOR_LABELS)},
                          pods={"default/train": train}, observe=lambda: loaded(node))
        self._operator(node, cluster, kubelet)
        kubelet.run(train, "python3")
        cluster.evictions["default/train"] = [429] * 1000  # a PDB that never allows
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-pause-operator",
                           "--upgrade-timeout", "2")
        assert done.returncode == UpgradeTimeoutError.code, done.stderr
        labels = cluster.node()["metadata"]["labels"]
        assert {k: labels[k] for k in OPERATOR_LABELS} == OPERATOR_LABELS
        assert "DriverUpgradeOperatorResumed" in reasons(cluster)
        assert cluster.states()[-1] == "upgrade-failed" and loaded(node) == V1
