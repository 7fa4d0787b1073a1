"""The agent's /metrics end to end: the real `agent` command in a subprocess on an 8-GPU
host tree, the real pynvml over the NVML stand-in whose readings the test writes
(FAKE_NVML_METRICS_FILE), scraped over HTTP on 127.0.0.1 and parsed by prometheus-client's
own parser; `promtool check metrics` (Debian's prometheus) lints the exposition.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import podresources
import pytest
from agentnode import A100_BUSES, AgentNode, make_node, wait_for
from helpers import http_get
from podresources import Container, Device, Pod
from prometheus_client.parser import text_string_to_metric_families

from installer.installdir.lastrun import LastInstall, write_last_install
from installer.installdir.state import InstallState, write_state
from installer.node.podresources import ContainerDevices
from installer.packages.manifest import Package

GPUS = 8
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def readings(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "nvml-metrics"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def gpu_line(i: int) -> str:
    """GPU i's readings: each value distinct per GPU so a mix-up shows."""
    return (f"uuid=GPU-aaaaaaaa-0000-4000-8000-00000000000{i} util={10 * i},{10 * i + 20} "
            f"mem_used_mib={1000 + i} temp={50 + i} power_mw={200000 + 1000 * i} "
            f"ecc_corrected={i} ecc_uncorrected={i % 2} remap_corr={i} remap_unc=0")


def metrics_node(tmp_path: Path, package: Package, lines: list[str], **env: str
                 ) -> tuple[AgentNode, str]:
    port = free_port()
    node = make_node(tmp_path, package, gpus=GPUS, env={
        "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1", "METRICS_INTERVAL": "1",
        "FAKE_NVML_METRICS_FILE": str(readings(tmp_path, lines)),
        "POD_RESOURCES_DIR": str(tmp_path / "no-pod-resources"), **env})
    return node, f"http://127.0.0.1:{port}"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base: str) -> Samples:
    status, text = http_get(base + "/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (None: absent)."""
    found = [v for (n, ls), v in samples.items()
             if n == name and set(labels.items()) <= set(ls)]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def served(base: str, name: str, **labels: str) -> Iterator[Samples]:
    """Wait until a scrape has `name{labels}` (the first collection may still run)."""
    holder: list[Samples] = []

    def ready() -> bool:
        try:
            holder[:] = [scrape(base)]
        except (urllib.error.URLError, ConnectionError):
            return False
        return value(holder[0], name, **labels) is not None

    wait_for(ready, timeout=60, step=0.3)
    yield holder[0]


def record_install(node: AgentNode, package: Package) -> None:
    """What `install` leaves on the node, by its own writers: the verified state and the
    run's outcome (a reboot's fast path here)."""
    manifest = package.manifest
    timings = {"detect": 12.0, "fetch": 3.5, "load": 250.0}
    write_state(node.install, InstallState(
        installer_version="0", requested_version="default", flavour_requested="auto",
        kernel_release=manifest.kernel_release, driver_version=manifest.driver_version,
        flavour=manifest.flavour, package_digest=package.digest, timings_ms=timings))
    write_last_install(node.install, LastInstall(0, fast_path=True, timings_ms=timings))


class TestScrape:
    """What the test set comes back, per GPU, with the install's and the agent's facts."""

    def test_values_set_by_the_test_come_back(self, tmp_path: Path, package: Package) -> None:
        node, base = metrics_node(tmp_path, package, [gpu_line(i) for i in range(GPUS)])
        record_install(node, package)
        with node.agent():
            wait_for(node.ready, timeout=60)
            samples = next(served(base, "gpu_node_installer_gpu_fabric_state",
                                  state="completed", gpu="7"))
            samples = next(served(base, "gpu_node_installer_daemon_up",
                                  daemon="nv-fabricmanager"))
            status, health = http_get(base + "/healthz")
        assert status == 200 and health.startswith("ok"), health
        for i in range(GPUS):
            gpu = {"gpu": str(i), "uuid": f"GPU-aaaaaaaa-0000-4000-8000-00000000000{i}",
                   "pci_bus_id": f"00000000:{A100_BUSES[i]}:00.0",
                   "model": "NVIDIA A100-SXM4-40GB"}
            # utilisation samples 10i and 10i+20: a duty cycle of 10i+10 percent
            assert value(samples, "gpu_node_installer_gpu_duty_cycle_ratio",
                         source="samples", **gpu) == pytest.approx((10 * i + 10) / 100)
            assert value(samples, "gpu_node_installer_gpu_memory_used_bytes",
                         **gpu) == (1000 + i) * MIB
            assert value(samples, "gpu_node_installer_gpu_memory_total_bytes",
                         **gpu) == 40960 * MIB
            assert value(samples, "gpu_node_installer_gpu_temperature_celsius", **gpu) == 50 + i
            assert value(samples, "gpu_node_installer_gpu_power_watts",
                         **gpu) == pytest.approx(200 + i)
            assert value(samples, "gpu_node_installer_gpu_ecc_errors_total",
                         type="corrected", **gpu) == i
            assert value(samples, "gpu_node_installer_gpu_ecc_errors_total",
                         type="uncorrected", **gpu) == i % 2
            assert value(samples, "gpu_node_installer_gpu_remapped_rows",
                         cause="correctable", **gpu) == i
            gke = {"make": "nvidia", "accelerator_id": gpu["uuid"], "model": gpu["model"]}
            assert value(samples, "duty_cycle_gpu_node", **gke) == pytest.approx(10 * i + 10)
            assert value(samples, "memory_used_gpu_node", **gke) == (1000 + i) * MIB
        node_labels = {frozenset(dict(ls)) for n, ls in samples if n.endswith("_gpu_node")}
        assert node_labels == {frozenset({"make", "accelerator_id", "model"})}  # GKE's since 2022
        manifest = package.manifest
        assert value(samples, "gpu_node_installer_info", driver_version="535.261.03",
                     cuda_version="12.2", flavour=manifest.flavour,
                     kernel=manifest.kernel_release, package_digest=package.digest) == 1
        assert value(samples, "gpu_node_installer_last_install_exit_code") == 0
        assert value(samples, "gpu_node_installer_install_fast_path") == 1
        assert value(samples, "gpu_node_installer_install_stage_seconds",
                     stage="load") == pytest.approx(0.25)
        assert value(samples, "gpu_node_installer_ready") == 1
        assert value(samples, "gpu_node_installer_daemon_up", daemon="nv-fabricmanager") == 1
        assert value(samples, "gpu_node_installer_daemon_restarts_total",
                     daemon="nv-fabricmanager") == 0

    def test_promtool_accepts_the_exposition(self, tmp_path: Path, package: Package) -> None:
        promtool = shutil.which("promtool")
        if promtool is None:
            pytest.skip("promtool missing: Debian's prometheus package (make deps)")
        node, base = metrics_node(tmp_path, package, [gpu_line(i) for i in range(GPUS)])
        with node.agent():
            next(served(base, "gpu_node_installer_gpu_memory_used_bytes", gpu="7"))
            status, text = http_get(base + "/metrics")
        assert status == 200
        done = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


class TestContainers:
    """Which container holds which GPU, from a real gRPC PodResources server (kubelet v1)."""

    def test_gke_names_per_container_by_each_plugins_ids(self, tmp_path: Path,
                                                         package: Package) -> None:
        sockets = podresources.short_dir()
        gpu, nic = "nvidia.com/gpu", "example.com/nic"
        # as the kubelet answers: one entry per device and NUMA node (nvidia5 is on two),
        # the GPU-less containers listed too
        assignments = [
            Pod("ml", "train-0", (Container("trainer", {gpu: (
                Device("nvidia2", (0,)), Device("nvidia5", (0, 1)))}, cpu_ids=(2, 3)),
                Container("logger"))),
            Pod("ml", "serve-0", (
                Container("server", {gpu: (Device("GPU-aaaaaaaa-0000-4000-8000-000000000007"),)}),
                Container("sidecar", {nic: (Device("eth1", None),)})))]
        node, base = metrics_node(tmp_path, package, [gpu_line(i) for i in range(GPUS)],
                                  POD_RESOURCES_DIR=str(sockets))
        try:
            with podresources.serve(sockets, assignments) as kubelet, node.agent():
                samples = next(served(base, "duty_cycle", pod="serve-0"))
                assert kubelet.calls >= 1
                status, text = http_get(base + "/metrics")
                kubelet.assignments = assignments[1:]  # train-0 finished
                gone = next(served(base, "gpu_node_installer_pod_resources_available"))
                wait_for(lambda: not [k for k in scrape(base) if dict(k[1]).get("pod")
                                      == "train-0"], timeout=30, step=0.5)
        finally:
            shutil.rmtree(sockets, ignore_errors=True)
        for index in (2, 5):
            labels = {"namespace": "ml", "pod": "train-0", "container": "trainer",
                      "make": "nvidia", "model": "NVIDIA A100-SXM4-40GB",
                      "accelerator_id": f"GPU-aaaaaaaa-0000-4000-8000-00000000000{index}"}
            assert value(samples, "duty_cycle", **labels) == pytest.approx(10 * index + 10)
            assert value(samples, "memory_used", **labels) == (1000 + index) * MIB
            assert value(samples, "memory_total", **labels) == 40960 * MIB
        assert value(samples, "duty_cycle", pod="serve-0", container="server") == \
            pytest.approx(80)
        assert value(samples, "request", pod="train-0", resource_name="nvidia.com/gpu") == 2
        assert value(samples, "request", pod="serve-0", container="server") == 1
        assert value(samples, "request", container="sidecar") is None  # not a GPU
        assert value(samples, "request", container="logger") is None  # holds nothing
        # one series per container and resource: Prometheus keeps one of identical series
        requests = [line for line in text.splitlines() if line.startswith("request{")]
        assert status == 200 and len(requests) == 2, requests
        per_gpu = [line for line in text.splitlines() if line.startswith("duty_cycle{")]
        assert len(per_gpu) == 3, per_gpu  # nvidia5's two NUMA entries are one GPU
        assert value(samples, "gpu_node_installer_pod_resources_available") == 1
        assert value(gone, "gpu_node_installer_pod_resources_available") == 1


class TestMigDevices:
    """MIG device UUIDs, read through the real pynvml from the NVML stand-in's MIG devices
    (tests/native/nvml_standin_mig_devices.c), name their GPU for a container holding one."""

    def test_a_containers_mig_device_is_its_gpu_shared(self, libs: Path,
                                                         fake_env: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
        from native.nvmlsession import h100_mig_node, nvml_session

        from installer.agent.metrics.attribution import holdings
        from installer.agent.metrics.nvml import NvmlReader
        from installer.agent.metrics.snapshot import Snapshot
        from installer.stages.partition import nvml as partition

        h100_mig_node(libs, fake_env.setenv, tmp_path)
        with nvml_session(libs):
            migs = [d.uuid for d in partition.read_gpus()[1].mig_devices]
            result = NvmlReader(Log()).read()
        assert len(migs) == 3 and all(m.startswith("MIG-") for m in migs)
        gpus = {g.index: g for g in result.gpus}
        assert gpus[0].mig_uuids == () and gpus[1].mig_uuids == tuple(migs)
        snap = Snapshot(taken_at=0, gpus=tuple(result.gpus), containers=(
            ContainerDevices("ml", "mig-0", "main", "nvidia.com/mig-1g.10gb", (migs[0],)),
            ContainerDevices("ml", "mig-1", "main", "nvidia.com/gpu", (f"{migs[2]}::1",)),
            ContainerDevices("ml", "whole", "main", "nvidia.com/gpu", (gpus[0].uuid,))))
        found = {pod: [(g.index, a) for g, a in held.values()]
                 for (_, pod, _), held in holdings(snap).items()}
        assert found == {"mig-0": [(1, "shared")], "mig-1": [(1, "shared")],
                         "whole": [(0, "exact")]}


class Log:
    """A structlog stand-in that keeps nothing."""

    def __getattr__(self, level: str) -> Any:
        return lambda *args, **fields: None


class TestDegraded:
    """What is known is still served; an error counter says what failed."""

    def test_nvml_error_on_one_gpu_leaves_the_others(self, tmp_path: Path,
                                                      package: Package) -> None:
        lines = [gpu_line(i) for i in range(GPUS)]
        node, base = metrics_node(tmp_path, package, lines)
        lines[3] += " error=15"  # GPU 3 is lost after the install verified it
        readings(tmp_path, lines)
        with node.agent():
            samples = next(served(base, "gpu_node_installer_collection_errors_total",
                                  source="nvml_gpu"))
            samples = next(served(base, "gpu_node_installer_gpu_memory_used_bytes", gpu="7"))
        errors = value(samples, "gpu_node_installer_collection_errors_total", source="nvml_gpu")
        assert errors is not None and errors >= 1
        for i in range(GPUS):
            used = value(samples, "gpu_node_installer_gpu_memory_used_bytes", gpu=str(i))
            assert used == (None if i == 3 else (1000 + i) * MIB), i
        # the lost GPU is still named (its handle works), only its readings are gone
        assert value(samples, "gpu_node_installer_gpu_duty_cycle_ratio", gpu="3") is None

    def test_no_kubelet_socket_still_serves_the_node(self, tmp_path: Path,
                                                     package: Package) -> None:
        node, base = metrics_node(tmp_path, package, [gpu_line(i) for i in range(GPUS)])
        with node.agent():
            samples = next(served(base, "gpu_node_installer_collection_errors_total",
                                  source="podresources"))
            samples = next(served(base, "duty_cycle_gpu_node",
                                  accelerator_id="GPU-aaaaaaaa-0000-4000-8000-000000000007"))
        assert value(samples, "gpu_node_installer_pod_resources_available") == 0
        assert not [key for key in samples if key[0] in ("duty_cycle", "request")]
        reasons = [line for line in node.log().splitlines()
                   if "per-container GPU metrics absent" in line]
        assert len(reasons) == 1, reasons  # said once, not every collection

    def test_no_samples_falls_back_to_the_instant_reading(self, tmp_path: Path,
                                                          package: Package) -> None:
        lines = [gpu_line(i) + " samples=unsupported" for i in range(GPUS)]
        node, base = metrics_node(tmp_path, package, lines)
        with node.agent():
            samples = next(served(base, "gpu_node_installer_gpu_duty_cycle_ratio", gpu="5"))
        # the instant reading is the last sample: 10*5+20 percent
        assert value(samples, "gpu_node_installer_gpu_duty_cycle_ratio", gpu="5",
                     source="instant") == pytest.approx(0.7)
        assert "no NVML utilisation samples" in node.log()


class TestServer:
    """Where metrics are served and where not."""

    def test_unknown_path_is_404_and_port_0_serves_nothing(self, tmp_path: Path,
                                                           package: Package) -> None:
        node, base = metrics_node(tmp_path / "on", package, [gpu_line(0)])
        with node.agent() as process:
            next(served(base, "gpu_node_installer_ready"))
            assert http_get(base + "/nothing")[0] == 404
            process.terminate()  # SIGTERM, as the kubelet: the server stops with the agent
            assert process.wait(timeout=60) == 0
        with pytest.raises(urllib.error.URLError):
            http_get(base + "/metrics")
        off, off_base = metrics_node(tmp_path / "off", package, [gpu_line(0)],
                                     METRICS_PORT="0")
        with off.agent():
            wait_for(off.ready, timeout=60)
            with pytest.raises(urllib.error.URLError):
                http_get(off_base + "/metrics")
        assert "metrics served" not in off.log() and "metrics served" in node.log()

    def test_once_does_not_serve(self, tmp_path: Path, package: Package) -> None:
        node, _ = metrics_node(tmp_path, package, [gpu_line(0)])
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert "metrics served" not in done.stderr + done.stdout
