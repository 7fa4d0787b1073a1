"""On a real kernel: a live driver upgrade frees the GPU, swaps the modules, is ready.

One guest boot (tests/kernel/upgrade_guest.py) runs the installer's real code against
Debian's kernel: real processes holding /dev/nvidia0 in real cgroup v2 directories named as
kubelet/containerd name them, the strict fake API server on the guest's 127.0.0.1 (it kills
the pod's process when it evicts the pod, as kubelet would), and the stand-in `nvidia`
modules of two versions (they act for one simulated GPU, as in `make demo`; NVML/CUDA are
the C stand-ins). The tests assert on what the guest recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from native import build_standins
from native.packages import standin_tree

from installer.packages.builder import BuildRequest, build

from . import guest
from .assets import Kernel
from .conftest import REPO

V1, V2 = "535.261.03", "550.54.14"
pytestmark = pytest.mark.timeout(1500)


def _repo(work: Path, kernel: Kernel, modules: dict[str, Path]) -> Path:
    """A repository with both versions: stand-in user mode, the guest kernel's modules."""
    built = build_standins(work / "built")
    for version in (V1, V2):
        tree = standin_tree(work / f"tree-{version}", built, version)
        build(BuildRequest(trees=(tree,), modules_dir=modules[version], driver_version=version,
                           kernel_release=kernel.release,
                           repo=work / "repo", aliases=(), force=True))
    return work / "repo"


@pytest.fixture(scope="module")
def guest_run(kernel: Kernel, test_modules: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("upgrade-kernel")
    out = work / "out"
    out.mkdir()
    args = {"repo": str(_repo(work, kernel, test_modules)), "v1": V1, "v2": V2}
    (out / "args.json").write_text(json.dumps(args))
    script = (f"set -e\n{guest.FAKE_GPU_SH}ip link set lo up\n"
              f'"{sys.executable}" tests/kernel/upgrade_guest.py "$GNI_OUT/args.json" '
              f'"$GNI_OUT/results.json"\n')
    result = guest.run_in_guest(script, kernel=kernel, timeout=1200, cwd=REPO,
                                env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}, out_dir=out,
                                memory_mb=3072)
    assert result.rc == 0, result.describe()
    data: dict[str, Any] = result.json("results.json")
    data["_wall_s"] = result.wall_s
    return data


def _explain(run: dict[str, Any]) -> str:
    return "\n".join(run["errors"] + run["stderr_tail"])


class TestLiveUpgrade:
    def test_v1_installed_first(self, guest_run: dict[str, Any]) -> None:
        first = guest_run["v1"]
        assert first["rc"] == 0, _explain(first)
        assert first["loaded"] == V1 and first["ready"]["driver_version"] == V1

    def test_a_holder_outside_any_pod_blocks_with_its_pid(self, guest_run: dict[str, Any]
                                                          ) -> None:
        blocked, cluster = guest_run["blocked"], guest_run["blocked_cluster"]
        pid = guest_run["host_holder_pid"]
        assert guest_run["host_holder_cgroup"] == "0::/system.slice/gpu-monitor.service\n"
        assert blocked["rc"] == 15, _explain(blocked)
        assert f"process {pid} (python3) is not in a pod" in _explain(blocked)
        assert guest_run["host_holder_alive"] is True  # never killed
        assert blocked["loaded"] == V1
        assert cluster["steps"] == ["patch:upgrade-required:-", "patch:upgrade-failed:-"]
        assert cluster["unschedulable"] is False and cluster["pods"] == ["default/train"]
        assert cluster["errors"] == []

    def test_a_pdb_that_never_allows_times_out_with_v1_serving_and_the_node_cordoned(
            self, guest_run: dict[str, Any]) -> None:
        pdb, cluster = guest_run["pdb"], guest_run["pdb_cluster"]
        assert guest_run["pod_holder_cgroup"].startswith("0::/kubepods.slice/")
        assert pdb["rc"] == 16, _explain(pdb)
        assert pdb["loaded"] == V1 and guest_run["pdb_holder_alive"] is True
        assert pdb["ready"] is not None and pdb["ready"]["driver_version"] == V1
        assert cluster["unschedulable"] is True
        assert cluster["labels"]["gpu-node-installer/upgrade-state"] == "upgrade-failed"
        assert "gpu-node-installer/cordoned-by" in cluster["annotations"]
        failed = [e for e in cluster["events"] if e["reason"] == "DriverUpgradeFailed"]
        assert failed and failed[-1]["type"] == "Warning"
        assert "PodDisruptionBudget" in failed[-1]["message"]
        assert "default/train" in failed[-1]["message"]
        assert cluster["errors"] == []

    def test_then_evicts_swaps_the_modules_for_real_and_uncordons(
            self, guest_run: dict[str, Any]) -> None:
        done, cluster = guest_run["done"], guest_run["done_cluster"]
        assert done["rc"] == 0, _explain(done)
        assert json.loads(done["stdout"])["driver_version"] == V2
        assert done["loaded"] == V2 and done["ready"]["driver_version"] == V2
        assert {"nvidia", "nvidia_uvm"} <= set(guest_run["modules"])
        calls = guest_run["done_calls"]
        changing = [c for c in calls if c["method"] in ("PATCH", "DELETE")
                    or c["path"].endswith("/eviction")]
        named = [(c["method"], c["path"].rsplit("/", 1)[-1], c["status"], c["state"],
                  c["observed"]) for c in changing]
        assert named == [
            ("PATCH", "gpu-node-1", 200, "upgrade-required", V1),  # resumes: already ours
            ("PATCH", "gpu-node-1", 200, "cordon-required", V1),
            ("PATCH", "gpu-node-1", 200, "pod-deletion-required", V1),
            ("POST", "eviction", 201, "pod-deletion-required", V1),
            ("PATCH", "gpu-node-1", 200, "validation-required", V1),
            ("PATCH", "gpu-node-1", 200, "validation-required", V2),  # unloaded, loaded, ready
            ("PATCH", "gpu-node-1", 200, "uncordon-required", V2),
            ("PATCH", "gpu-node-1", 200, "upgrade-done", V2)]
        assert cluster["unschedulable"] is False
        assert "gpu-node-installer/cordoned-by" not in cluster["annotations"]
        assert cluster["labels"]["gpu-node-installer/driver-version"] == V2
        assert cluster["pods"] == [] and cluster["errors"] == []


class TestGpuDaemonSets:
    """GKE's device plugin comes straight back when deleted and reopens the
    driver as soon as /dev/nvidiactl and /dev/nvidia-uvm exist."""

    def test_a_plugin_that_reopens_at_once_is_held_until_the_new_driver_is_ready(
            self, guest_run: dict[str, Any]) -> None:
        done, cluster = guest_run["plugin_done"], guest_run["plugin_cluster"]
        assert guest_run["plugin_cgroup"].startswith("kubepods.slice/kubepods-besteffort")
        assert guest_run["plugin_first"] == {"driver": V2, "ready": V2}  # it held V2
        assert done["rc"] == 0, _explain(done)
        assert done["loaded"] == V1 and done["ready"]["driver_version"] == V1
        assert cluster["states"][-1] == "upgrade-done" and cluster["errors"] == []
        first, back = guest_run["plugin_made"]  # deleted once, recreated at once
        assert guest_run["plugin_back"] == {"driver": V1, "ready": V1}
        deletes = [(c["path"].rsplit("/", 1)[-1], c["status"], c["observed"])
                   for c in guest_run["plugin_calls"] if c["method"] == "DELETE"]
        assert deletes == [(first, 200, V2)]
        reasons = [e["reason"] for e in cluster["events"]]
        assert reasons.index("DriverUpgradeGateHeld") < reasons.index("DriverUpgradeGateOpened")
        assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0"} \
            <= set(guest_run["plugin_nodes"])
        assert f"kube-system/{back}" in cluster["pods"]
