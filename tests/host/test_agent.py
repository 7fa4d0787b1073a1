"""The node agent end to end: the real `agent` command in a subprocess on a temp host tree,
the daemon stand-ins (tests/native/daemons.py) staged from the package, NVML's fabric state
through the real pynvml over the NVML stand-in, the cluster as the strict fake API.

Bounds that the issue asks for are asserted (readiness withdrawn within 10 s of a daemon's
death; SIGTERM handled within the pod's grace period); every other wait is a generous poll.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import kubefake
from agentnode import VERSION, daemon_package, make_node, wait_for
from kubefake import Cluster
from native.daemons import write_fabric

from installer.packages.manifest import Package

GRACE_S = 45  # the DaemonSet's terminationGracePeriodSeconds


def condition(cluster: Cluster) -> dict[str, object]:
    return kubefake.conditions(cluster).get("gpu-node-installer/DriverReady", {})


def label(cluster: Cluster) -> str | None:
    return cluster.node()["metadata"].get("labels", {}).get("gpu-node-installer/status")


class TestNvswitchNode:
    """An 8-GPU HGX A100 node: Fabric Manager and persistenced, readiness follows the fabric."""

    def test_not_ready_until_the_fabric_completes(self, tmp_path: Path, package: Package,
                                                  cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, env={"FAKE_FM_SECONDS": "4",
                                                 "NVFM_CONFIG_LOG_LEVEL": "2"})
        ready_bytes = [path.read_bytes() for path in node.ready_files()]
        with node.agent(api=url) as agent:
            wait_for(lambda: node.view(), 60)
            first = node.view()
            assert first["ready"] is False and first["cause"] in (
                "DaemonStarting", "FabricInProgress"), first
            assert not node.ready()  # withdrawn while the fabric trains
            wait_for(lambda: node.view().get("ready") is True, 60)
            assert [p.read_bytes() for p in node.ready_files()] == ready_bytes
            view = node.view()
            assert view["ready"] is True and view["fabric_kind"] == "nvswitch"
            assert [g["state"] for g in view["fabric"]] == ["completed"] * 8  # type: ignore
            assert agent.poll() is None
            environ = Path(f"/proc/{node.pid('nv-fabricmanager')}/environ").read_bytes()
            assert f"LD_LIBRARY_PATH={node.install / 'lib64'}".encode() in environ.split(b"\0")
        assert node.start_order() == ["nvidia-persistenced", "nv-fabricmanager"]
        assert sorted(node.started()) == sorted(node.start_order())
        work = node.install / ".agent"
        assert node.argv("nv-fabricmanager") == ["-c", str(work / "fabricmanager.cfg")]
        assert (work / "fabricmanager.cfg").read_text().splitlines() == [
            "# Fabric Manager (stand-in)", "LOG_LEVEL=2", "DAEMONIZE=0", "FABRIC_MODE=0",
            f"TOPOLOGY_FILE_PATH={node.install / '.current/etc'}"]  # where it was staged
        assert node.argv("nvidia-persistenced") == ["--persistence-mode", "--foreground"]
        reasons = [c.body["status"]["conditions"][0]["reason"]  # type: ignore[index]
                   for c in api.calls if c.path.endswith("/status")]
        assert reasons[0] in ("DaemonStarting", "FabricInProgress")
        assert reasons[-2:] == ["Ready", "AgentStopped"]

    def test_fabric_manager_killed_withdraws_readiness_then_restores_it(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package)
        with node.agent(api=url):
            wait_for(lambda: label(api) == "ready", 60)
            assert condition(api)["status"] == "True" and node.ready()
            first = node.pid("nv-fabricmanager")
            assert first is not None
            os.kill(first, signal.SIGKILL)  # the fabric file stays "completed": only the
            took = wait_for(lambda: not node.ready(), 10, step=0.05)  # daemon's exit tells
            assert took <= 10
            wait_for(lambda: label(api) == "not-ready", 30)
            assert condition(api)["reason"] == "DaemonDown"
            wait_for(node.ready, 60)
            second = node.pid("nv-fabricmanager")
            assert second not in (None, first)
            wait_for(lambda: condition(api).get("status") == "True", 30)
            daemons = node.view()["daemons"]
            assert daemons["nv-fabricmanager"]["restarts"] == 1  # type: ignore[index]
        assert node.started().count("nv-fabricmanager") == 2

    def test_fabric_that_never_completes_is_not_ready_with_event_and_condition(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, env={"FAKE_FM_FAIL": "never-complete",
                                                 "FABRIC_TIMEOUT": "3"})
        with node.agent(api=url):
            wait_for(lambda: any(e["reason"] == "FabricNotReady" for e in api.events), 60)
            wait_for(lambda: condition(api).get("reason") == "FabricTimeout", 30)
            assert not node.ready()
            status = node.run("status")
        (event,) = [e for e in api.events if e["reason"] == "FabricNotReady"]
        assert event["type"] == "Warning"
        assert "8 GPUs: 8 in-progress" in event["message"]
        assert "0000:07:00.0 in-progress" in event["message"]  # by PCI address
        assert condition(api)["status"] == "False"
        assert "8 GPUs: 8 in-progress" in str(condition(api)["message"])
        assert label(api) == "not-ready"
        assert status.returncode == 0, status.stderr
        assert "GPU 7: fabric in-progress" in status.stdout
        assert "FABRIC_TIMEOUT=3" in status.stdout
        assert '"GPU 3:in-progress"' in node.log() or "3:in-progress" in node.log()

    def test_sigterm_stops_the_agent_and_its_daemons(self, tmp_path: Path,
                                                     package: Package) -> None:
        node = make_node(tmp_path, package)
        with node.agent() as agent:
            wait_for(lambda: node.view().get("ready") is True, 60)
            pids = [node.pid(name) for name in ("nv-fabricmanager", "nvidia-persistenced")]
            assert None not in pids
            start = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=GRACE_S) == 0
            assert time.monotonic() - start < GRACE_S
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        assert node.pid("nv-fabricmanager") is None and node.pid("nvidia-persistenced") is None
        assert not node.ready()  # Fabric Manager stopped: the node really is not ready
        assert not (node.install / ".agent.json").exists()
        assert '"agent stopped"' in node.log()

    def test_a_restarted_agent_adopts_the_daemons_and_restores_the_installs_bytes(
            self, tmp_path: Path, package: Package) -> None:
        """Killed while readiness is withdrawn (a container restart): the next agent finds
        the install's readiness in its work area and the daemons by their pid files."""
        node = make_node(tmp_path, package, env={"FAKE_FM_SECONDS": "10"})
        ready_bytes = [path.read_bytes() for path in node.ready_files()]
        first = subprocess.Popen(node.command("agent"), env=node.env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: node.view().get("cause") == "FabricInProgress", 60)
            assert not node.ready()
        finally:
            first.kill()
            first.wait()
        fm = node.pid("nv-fabricmanager")
        assert fm is not None and _alive(fm)  # in its own session: it outlived the agent
        with node.agent():
            wait_for(lambda: node.view().get("ready") is True, 60)
            assert [p.read_bytes() for p in node.ready_files()] == ready_bytes
            assert node.pid("nv-fabricmanager") == fm
        assert sorted(node.started()) == ["nv-fabricmanager", "nvidia-persistenced"]  # once
        assert '"daemon already running: adopted"' in node.log()

    def test_a_package_without_fabric_manager_is_refused(self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=("nvidia-persistenced",))
        node = make_node(tmp_path, package)
        done = node.run("agent", "--once")
        assert done.returncode == 14, done.stderr
        assert "needs nv-fabricmanager" in done.stderr and "--fabricmanager" in done.stderr
        assert node.started() == []

    def test_fabric_manager_run_by_the_host_is_waited_for_not_started(
            self, tmp_path: Path) -> None:
        """FABRIC_MANAGER=host (COS: the node runs it): a package without it is fine, the
        agent starts only persistenced and is ready once the host's fabric completes."""
        package = daemon_package(tmp_path / "pkg", daemons=("nvidia-persistenced",))
        node = make_node(tmp_path, package, env={"FABRIC_MANAGER": "host"})
        with node.agent():
            wait_for(lambda: node.view().get("cause") == "FabricInProgress", 60)
            assert not node.ready()
            write_fabric(node.fabric, [(3, 0)] * 8)  # the host's Fabric Manager trained it
            wait_for(lambda: node.view().get("ready") is True, 60)
            assert node.ready()
        assert node.start_order() == ["nvidia-persistenced"]

    def test_a_fabric_manager_of_another_version_is_refused(self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", fm_version="535.230.02")
        node = make_node(tmp_path, package)
        done = node.run("agent", "--once")
        assert done.returncode == 14, done.stderr
        assert f"Fabric Manager 535.230.02 in the package differs from the driver {VERSION}" \
            in done.stderr
        assert node.started() == []

    def test_a_bad_fabric_manager_override_is_refused(self, tmp_path: Path,
                                                      package: Package) -> None:
        for env, words in (({"NVFM_CONFIG_NO_SUCH_FIELD": "1"}, "has no field NO_SUCH_FIELD"),
                           ({"NVFM_CONFIG_LOG_LEVEL": "4\nDAEMONIZE=1"}, "is invalid")):
            node = make_node(tmp_path / str(len(words)), package, env=env)
            done = node.run("agent", "--once")
            assert done.returncode == 2, done.stderr
            assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
            assert node.started() == []

    def test_once_waits_for_the_fabric_and_stops_what_it_started(
            self, tmp_path: Path, package: Package) -> None:
        node = make_node(tmp_path, package)
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert "fabric complete: 8 GPUs: 8 completed" in done.stdout
        assert node.pid("nv-fabricmanager") is None  # stopped again
        assert sorted(node.started()) == ["nv-fabricmanager", "nvidia-persistenced"]


class TestOtherNodes:
    def test_nvlink5_waits_for_the_infiniband_modules_then_starts_both(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, env={"FAKE_FM_NEEDS_NVLSM": "1",
                                                 "FABRIC_TIMEOUT": "4"})
        vpd = node.root / "sys/class/infiniband/mlx5_0/device/vpd"
        vpd.parent.mkdir(parents=True)
        vpd.write_bytes(b"\x82\x10NVIDIA ConnectX-7\x90\x08SW_MNG\x00\x78")
        with node.agent(api=url):
            wait_for(lambda: node.view().get("cause") == "WaitingForInfiniBand", 60)
            assert "mlx5_core, ib_umad" in str(node.view()["reason"])
            wait_for(lambda: node.view().get("cause") == "InfiniBandModulesMissing", 60)
            wait_for(lambda: any(e["reason"] == "InfiniBandModulesMissing"  # queued: the
                                 for e in api.events), 10)  # files first, the API after
            (event,) = [e for e in api.events if e["reason"] == "InfiniBandModulesMissing"]
            assert "mlx5_core, ib_umad not loaded" in event["message"]
            assert node.started() == ["nvidia-persistenced"]  # neither fabric daemon yet
            (node.root / "proc/modules").write_text(
                "mlx5_core 2375680 1 mlx5_ib, Live 0x0000000000000000\n"
                "ib_umad 45056 0 - Live 0x0000000000000000\n")
            wait_for(lambda: node.view().get("ready") is True, 60)
            assert node.view()["fabric_kind"] == "nvlink5" and node.ready()
        assert node.start_order() == ["nvidia-persistenced", "nvlsm", "nv-fabricmanager"]
        assert sorted(node.started()) == sorted(node.start_order())  # what really ran
        assert node.argv("nvlsm") == ["-F", str(node.install / ".current/etc/nvlsm.conf")]
        assert '"cause": "WaitingForInfiniBand"' in node.log()  # the wait is logged

    def test_a_node_without_nvswitch_runs_only_persistenced(
            self, tmp_path: Path, package: Package) -> None:
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1)
        done = node.run("agent", "--once", "--output", "json")
        assert done.returncode == 0, done.stderr
        assert node.started() == ["nvidia-persistenced"]
        assert node.pid("nvidia-persistenced") is None  # --once stops what it started
        assert node.ready()

    def test_persistence_off_runs_nothing(self, tmp_path: Path, package: Package) -> None:
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                         env={"PERSISTENCE_MODE": "off"})
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert node.started() == []
        assert "no daemons needed" in done.stdout

    def test_a_daemon_that_keeps_failing_leaves_the_node_not_ready_with_its_log(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                         env={"FAKE_PERSISTENCED_FAIL": "start"})
        with node.agent(api=url):
            wait_for(lambda: any(e["reason"] == "DaemonFailing" for e in api.events), 120)
            assert not node.ready()
        (event,) = [e for e in api.events if e["reason"] == "DaemonFailing"]
        assert "nvidia-persistenced keeps failing" in event["message"]
        assert "failed to start (FAKE fail=start)" in event["message"]  # its last lines
        assert condition(api)["reason"] == "DaemonFailing"


class TestProbe:
    def test_probe_follows_the_running_agents_view(self, tmp_path: Path,
                                                   package: Package) -> None:
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1)
        done = node.run("agent", "--probe")
        assert done.returncode == 12 and "no agent view" in done.stderr
        assert not (node.root / "termlog").exists()  # a probe is no container's last word
        with node.agent():
            wait_for(lambda: node.view().get("ready") is True, 60)
            done = node.run("agent", "--probe")
            assert done.returncode == 0, done.stderr
        view = node.install / ".agent.json"
        view.write_text(json.dumps({"ready": True, "reason": "old",
                                    "updated_at": time.time() - 600}))
        done = node.run("agent", "--probe")
        assert done.returncode == 12 and "stale" in done.stderr


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
