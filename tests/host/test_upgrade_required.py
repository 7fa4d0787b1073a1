"""UPGRADE_POLICY=refuse and a driver change on a busy node: the per-pool map's entry moves
to V2 while a pod holds V1. The node reports `upgrade-required` (state label, a Warning
Event), the run exits 10 saying it waits and what to do, nothing on the host changes; once
the GPUs are freed the next run installs V2 and takes the label away.

Same scene as tests/host/test_upgrade.py (a node serving V1, a mirror with V1 and V2, the
strict fake API server, tests/kubefake.py).
"""

from __future__ import annotations

import subprocess

import kubefake
from e2e import Scene, run_cli, standin_env
from host import test_upgrade as shared
from host.test_upgrade import NODE, UID, V1, V2, account, cluster_with, kernel, loaded, pod_cgroup
from kubefake import Cluster, pod_doc

from installer.errors import ModuleInUseError

repo, scene = shared.repo, shared.scene  # the fixtures: V1 serving, V1+V2 mirror
POOL = "cloud.google.com/gke-nodepool"
STATE = kubefake.STATE


def with_map(node: Scene, mirror: str, api: str, version: str
             ) -> subprocess.CompletedProcess[str]:
    """An install under the default policy (refuse) whose map gives `version` to the pool;
    NVIDIA_DRIVER_VERSION stays V1 (the fallback)."""
    path = node.work / "version-map.yaml"
    path.write_text(f"- selector: {{{POOL}: h200-pool}}\n  version: '{version}'\n")
    return run_cli(["install", *node.args(
        "--mirror", mirror, "--allow-http", "--driver-version", V1,
        "--driver-version-map", str(path), "--node-name", NODE, "--kube-api", api,
        "--service-account-dir", str(account(node)), "--output", "json")],
        standin_env(version))


def events(cluster: Cluster, reason: str) -> list[dict[str, object]]:
    return [e for e in cluster.events if e["reason"] == reason]


def test_refuse_reports_upgrade_required_waits_then_installs_once_freed(
        scene: tuple[Scene, str]) -> None:
    node, mirror = scene
    pid = kernel(node).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(UID))
    cluster = cluster_with(node, pod_doc("train", UID, NODE, limits={"nvidia.com/gpu": "1"}))
    cluster.node()["metadata"].setdefault("labels", {})[POOL] = "h200-pool"
    with kubefake.serve(cluster) as api:
        same = with_map(node, mirror, api, V1)  # the entry still says V1: nothing to tell
        assert same.returncode == 0, same.stderr
        assert STATE not in cluster.node()["metadata"]["labels"]
        waiting = with_map(node, mirror, api, V2)  # the pool's entry changed
        assert waiting.returncode == ModuleInUseError.code, waiting.stderr
        line = waiting.stderr.strip().splitlines()[-1]
        assert line.startswith("error(module-in-use)")
        assert f"driver {V2} is wanted and UPGRADE_POLICY=refuse" in line
        assert f"labelled {STATE}=upgrade-required and waits" in line
        assert f"{pid} (python3)" in line  # the holder is named
        assert "fix: free the node's GPUs" in line and "UPGRADE_POLICY=evict" in line
        assert cluster.node()["metadata"]["labels"][STATE] == "upgrade-required"
        told = events(cluster, "DriverUpgradeRequired")
        assert len(told) == 1 and told[0]["type"] == "Warning"
        assert f"driver {V2} is wanted" in str(told[0]["message"])
        assert not any(s.startswith(("evict:", "delete:", "patch:cordon")) for s in
                       cluster.steps())
        assert cluster.node()["spec"].get("unschedulable") is None
        assert loaded(node) == V1
        again = with_map(node, mirror, api, V2)  # still busy: it keeps waiting
        assert again.returncode == ModuleInUseError.code, again.stderr
        assert loaded(node) == V1
        kernel(node).close_device(pid)  # someone freed the GPUs
        del cluster.pods["default/train"]
        done = with_map(node, mirror, api, V2)
    assert done.returncode == 0, done.stderr
    assert loaded(node) == V2
    assert STATE not in cluster.node()["metadata"]["labels"]
    assert len(events(cluster, "DriverUpgradeProceeding")) == 1
    assert cluster.errors == []
