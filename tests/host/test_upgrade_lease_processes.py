"""The pool limit held by whole installer processes started together: 3 nodes with
UPGRADE_MAX_UNAVAILABLE=1 and 5 nodes with 2, each node its own host tree (the simulated
kernel, a GPU pod's process holding /dev/nvidia0) and its own `install` process, all sharing
one strict fake API server (tests/kubefake.py, Leases by tests/kubelease.py) that answers
every call after a random delay, so the processes' calls interleave differently each trial.

After every call the fake answers, the cordoned nodes are counted: never more than the
limit. Every trial ends with each process done (exit 0, its node on the new driver,
uncordoned, `upgrade-done`), or waiting with its reason (exit 17, untouched) and then done
on its rerun: none stuck, every slot given back. A trial upgrades every node from the driver
it serves to the other one (V1 to V2, then back), so one install per node serves them all.

TRIALS (3) per pool, fewer than tests/host/test_upgrade_lease.py::TestManyInstallers (50
each, the guard and its Node writes on threads): a full install per node and trial costs
seconds. With the Lease taken out (the count alone, checked then acted on), the 5-node pool
had all 5 nodes cordoned at once in its first trial.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import kubefake
import kubelease
import pytest
from e2e import Scene, make_scene
from host import test_upgrade
from host.test_upgrade import V1, V2, account, install, kernel, loaded, pod_cgroup
from httpserver import MirrorServer
from kubefake import Cluster, node_doc, pod_doc

from installer.errors import UpgradeWaitingError
from installer.upgrade import rollout

repo = test_upgrade.repo  # the fixture: V1 and V2 packages, built once for the module
TRIALS = 3
STATE = kubefake.STATE


def _uid(trial: int, index: int) -> str:
    return f"{trial:08x}-{index:04x}-4000-8000-000000000000"


class Pool:
    """The nodes (a scene each, serving V1 at first), the cluster, and each trial's pods."""

    def __init__(self, base: Path, mirror: str, size: int) -> None:
        self.mirror = mirror
        self.names = [f"gpu-node-{i}" for i in range(size)]
        self.scenes: dict[str, Scene] = {}
        for name in self.names:
            (base / name).mkdir()
            self.scenes[name] = make_scene(base / name)
            first = install(self.scenes[name], mirror, V1)
            assert first.returncode == 0, first.stderr
        self.cluster = Cluster(node_name=self.names[0], jitter_s=0.01)
        self.cluster.nodes = {n: node_doc(n, {rollout.MANAGED_LABEL: V1}) for n in self.names}
        self.holders: dict[str, tuple[str, int]] = {}  # pod name -> (node, pid)
        self.cluster.on_evict = self._kubelet
        self.most = 0
        self.cluster.observe = self._count

    def _kubelet(self, pod: dict[str, object]) -> None:
        found = self.holders.get(pod["metadata"]["name"])  # type: ignore[index]
        if found is not None:
            kernel(self.scenes[found[0]]).close_device(found[1])

    def _count(self) -> str:
        """Called under the fake's lock after every answer: the cordoned nodes now."""
        cordoned = sum(1 for n in self.cluster.nodes.values() if n["spec"].get("unschedulable"))
        self.most = max(self.most, cordoned)
        return str(cordoned)

    def busy(self, trial: int) -> None:
        """A GPU pod per node for this trial, its process holding the GPU."""
        with self.cluster.lock:
            for index, name in enumerate(self.names):
                uid, pod = _uid(trial, index), f"train-{trial}-{index}"
                pid = kernel(self.scenes[name]).open_device("nvidia", "/dev/nvidia0",
                                                            "python3", pod_cgroup(uid))
                self.holders[pod] = (name, pid)
                self.cluster.pods[f"default/{pod}"] = pod_doc(pod, uid, name)
            self.most = 0

    def upgrade(self, name: str, url: str, version: str, limit: str
                ) -> subprocess.CompletedProcess[str]:
        scene = self.scenes[name]
        return install(scene, self.mirror, version, "--upgrade-policy", "evict",
                       "--node-name", name, "--kube-api", url, "--service-account-dir",
                       str(account(scene)), "--upgrade-max-unavailable", limit,
                       "--upgrade-timeout", "20")

    def together(self, url: str, version: str, limit: str
                 ) -> dict[str, subprocess.CompletedProcess[str]]:
        """Every node's installer process started at the same moment."""
        start = threading.Barrier(len(self.names))
        done: dict[str, subprocess.CompletedProcess[str]] = {}

        def run(name: str) -> None:
            start.wait()
            done[name] = self.upgrade(name, url, version, limit)

        threads = [threading.Thread(target=run, args=(n,)) for n in self.names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(150)
        return done


@pytest.mark.parametrize(("size", "limit"), [(3, "1"), (5, "2")])
def test_installer_processes_started_together_keep_the_limit(
        tmp_path: Path, repo: Path, size: int, limit: str) -> None:
    with MirrorServer(repo) as mirror:
        pool = Pool(tmp_path, mirror.url, size)
        with kubefake.serve(pool.cluster) as url:
            for trial in range(TRIALS):
                version = V2 if trial % 2 == 0 else V1
                pool.busy(trial)
                done = pool.together(url, version, limit)
                assert sorted(done) == pool.names, f"trial {trial}: a process never ended"
                for name, result in done.items():
                    if result.returncode == UpgradeWaitingError.code:  # its turn did not come
                        line = result.stderr.strip().splitlines()[-1]
                        assert line.startswith("error(upgrade-waiting)"), line
                        assert pool.cluster.nodes[name]["spec"].get("unschedulable") is None
                        done[name] = pool.upgrade(name, url, version, limit)
                _all_upgraded(pool, trial, version, limit, done)


def _all_upgraded(pool: Pool, trial: int, version: str, limit: str,
                  done: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """Every node on `version`, uncordoned, upgrade-done; never more cordoned than the
    limit; every slot released; the trial's pods gone."""
    cluster = pool.cluster
    for name, result in done.items():
        assert result.returncode == 0, (trial, name, result.stderr[-3000:])
    assert pool.most <= int(limit), f"trial {trial}: {pool.most} cordoned at once"
    assert cluster.errors == [], f"trial {trial}"
    assert all(kubelease.holder(doc) is None for doc in cluster.leases.values())
    for name in pool.names:
        node = cluster.nodes[name]
        assert node["spec"].get("unschedulable") is None, (trial, name)
        assert node["metadata"]["labels"][STATE] == "upgrade-done", (trial, name)
        assert loaded(pool.scenes[name]) == version, (trial, name)
    assert not any(p.startswith("default/train-") for p in cluster.pods)
