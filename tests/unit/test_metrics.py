"""The agent's metrics without a process: a snapshot rendered through prometheus-client's
own registry and text format, the device-id mapping GKE's and NVIDIA's plugins need, the
last-install record, and the settings' parsers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import http_get
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from installer.agent.metrics import gke
from installer.agent.metrics.attribution import holdings
from installer.agent.metrics.server import SnapshotCollector
from installer.agent.metrics.snapshot import GpuReading, InstallFacts, Snapshot
from installer.config import agent as settings
from installer.config.values import Invalid
from installer.installdir.lastrun import (
    LAST_INSTALL_FILE,
    LastInstall,
    read_last_install,
    write_last_install,
)
from installer.node.podresources import ClaimDevice, ContainerDevices

GIB = 1024**3


def gpu(index: int, *, duty: float | None = 50.0, minor: int | None = None) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index:08d}-0000-4000-8000-000000000000",
                      model="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{index + 16:02X}:00.0",
                      minor=minor, duty_cycle=duty, memory_used=index * GIB,
                      memory_total=80 * GIB)


def holder(pod: str, *ids: str, resource: str = "nvidia.com/gpu") -> ContainerDevices:
    return ContainerDevices("ml", pod, "trainer", resource, tuple(ids))


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def error(self, event: str, **fields: object) -> None:
        self.lines.append(f"{event} {fields}")


def render(snap: Snapshot, log: Log | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]],
                                                         float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, log or Log()))
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def names(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {name for name, _ in samples}


class TestContainers:
    """GKE's per-container names for GPUs named by UUID, nvidia<minor> or index."""

    def test_each_plugin_naming_maps_to_its_gpu(self) -> None:
        gpus = (gpu(0, minor=4), gpu(1), gpu(2))
        snap = Snapshot(taken_at=0, gpus=gpus, containers=(
            holder("by-minor", "nvidia4"), holder("by-uuid", gpus[1].uuid),
            holder("by-index", "2"), holder("unknown", "nvidia9")))
        found = {h[1]: [(g.index, a) for g, a in gs.values()]
                 for h, gs in holdings(snap).items()}
        assert found == {"by-minor": [(0, "exact")], "by-uuid": [(1, "exact")],
                         "by-index": [(2, "exact")], "unknown": []}

    def test_shared_ids_map_to_their_gpu_as_shared(self) -> None:
        """dcgm-exporter's forms: NVIDIA's time-sliced `<id>::<n>`, GKE's `/vgpu<n>` and
        `/gi<g>`, MIG UUIDs (also time-sliced, and the pre-R470 MIG-GPU-<uuid>/gi/ci)."""
        mig = "MIG-5fa0c2d4-0001-4000-8000-000000000002"
        gpus = (gpu(0), gpu(1), GpuReading(index=2, uuid="GPU-2", model="NVIDIA A100-SXM4-40GB",
                                           pci_bus_id="x", mig_uuids=(mig,)))
        cases = {"sliced": f"{gpus[0].uuid}::3", "vgpu": "nvidia1/vgpu2",
                 "gke-mig": "nvidia2/gi1", "gke-mig-shared": "nvidia2/gi1/vgpu0",
                 "mig": mig, "mig-sliced": f"{mig}::1", "old-mig": "MIG-GPU-2/1/0",
                 "whole": gpus[1].uuid, "bogus": "GPU-9::1"}
        snap = Snapshot(taken_at=0, gpus=gpus, containers=tuple(
            holder(pod, device) for pod, device in cases.items()))
        found = {h[1]: [(g.index, a) for g, a in gs.values()]
                 for h, gs in holdings(snap).items()}
        assert found == {"sliced": [(0, "shared")], "vgpu": [(1, "shared")],
                         "gke-mig": [(2, "shared")], "gke-mig-shared": [(2, "shared")],
                         "mig": [(2, "shared")], "mig-sliced": [(2, "shared")],
                         "old-mig": [(2, "shared")], "whole": [(1, "exact")], "bogus": []}

    def test_time_sliced_replicas_give_each_container_the_gpu(self) -> None:
        gpus = (gpu(0, duty=40.0),)
        snap = Snapshot(taken_at=0, gpus=gpus, containers=(
            holder("a", f"{gpus[0].uuid}::0"), holder("b", f"{gpus[0].uuid}::1"),
            holder("b", f"{gpus[0].uuid}::2")))
        samples = render(snap)
        duty = {(dict(k[1])["pod"], dict(k[1])["attribution"]): v for k, v in samples.items()
                if k[0] == "duty_cycle"}
        assert duty == {("a", "shared"): 40.0, ("b", "shared"): 40.0}
        request = {dict(k[1])["pod"]: v for k, v in samples.items() if k[0] == "request"}
        assert request == {"a": 1, "b": 2}  # replicas, as the kubelet assigned them

    def test_dra_claims_by_claim_and_device(self) -> None:
        gpus = (gpu(0, duty=10.0, minor=0), gpu(1, duty=20.0, minor=1), gpu(2, minor=2))

        def claim(container: str, device: str, share: str | None = None,
                  driver: str = "gpu.nvidia.com") -> ClaimDevice:
            return ClaimDevice("ml", "dra-0", container, "ml/gpus", driver, "node-1", device,
                               share)

        snap = Snapshot(taken_at=0, gpus=gpus, containers=(
            claim("whole", "gpu-0"), claim("shared", "gpu-1", share="a1b2"),
            claim("mig", "gpu-2-mig-1g10gb-19-0"), claim("other", "gpu-0", driver="x.com"),
            claim("gone", "gpu-7")))
        samples = render(snap)
        duty = {(dict(k[1])["container"], dict(k[1])["accelerator_id"],
                 dict(k[1])["attribution"]): v for k, v in samples.items()
                if k[0] == "duty_cycle"}
        assert duty == {("whole", gpus[0].uuid, "exact"): 10.0,
                        ("shared", gpus[1].uuid, "shared"): 20.0,
                        ("mig", gpus[2].uuid, "shared"): 50.0}
        claims = sorted((dict(k[1])["container"], dict(k[1])["claim"], dict(k[1])["device"],
                         dict(k[1])["pool"]) for k in samples
                        if k[0] == "gpu_node_installer_container_gpu_claim")
        assert claims == [("mig", "ml/gpus", "gpu-2-mig-1g10gb-19-0", "node-1"),
                          ("shared", "ml/gpus", "gpu-1", "node-1"),
                          ("whole", "ml/gpus", "gpu-0", "node-1")]
        assert not [k for k in samples if k[0] == "request"]  # claims are not requests

    def test_gke_labels_and_request(self) -> None:
        gpus = (gpu(0, duty=25.0), gpu(1, duty=75.0))
        snap = Snapshot(taken_at=0, gpus=gpus, containers=(
            holder("train-0", "nvidia0", "nvidia1"), holder("other", "x", resource="foo/bar")))
        samples = render(snap)
        labels = {"namespace": "ml", "pod": "train-0", "container": "trainer", "make": "nvidia",
                  "accelerator_id": gpus[1].uuid, "model": "NVIDIA H100 80GB HBM3",
                  "attribution": "exact"}
        assert samples[("duty_cycle", frozenset(labels.items()))] == 75.0
        assert samples[("memory_used", frozenset(labels.items()))] == GIB
        assert samples[("memory_total", frozenset(labels.items()))] == 80 * GIB
        request = {"namespace": "ml", "pod": "train-0", "container": "trainer",
                   "resource_name": "nvidia.com/gpu"}
        assert samples[("request", frozenset(request.items()))] == 2
        assert not [k for k in samples if dict(k[1]).get("pod") == "other"]  # not a GPU
        assert samples[("gpu_node_installer_pod_resources_available", frozenset())] == 1

    def test_one_row_per_device_sums_to_one_request_series(self) -> None:
        """The kubelet's shape: one entry per device (twice for a device on two NUMA
        nodes), each container listed even holding nothing."""
        gpus = (gpu(0, duty=25.0), gpu(1, duty=75.0), gpu(2))
        snap = Snapshot(taken_at=0, gpus=gpus, containers=(
            holder("train-0", "nvidia0"), holder("train-0", "nvidia1"),
            holder("train-0", "nvidia1"), holder("train-0", resource="example.com/nic"),
            holder("infer-0", gpus[2].uuid), holder("infer-0", "nvidia2")))
        samples = render(snap)
        request = {(dict(k[1])["pod"]): v for k, v in samples.items() if k[0] == "request"}
        assert request == {"train-0": 2, "infer-0": 2}  # two ids, whatever they name
        duty = sorted((dict(k[1])["pod"], dict(k[1])["accelerator_id"])
                      for k in samples if k[0] == "duty_cycle")
        assert duty == [("infer-0", gpus[2].uuid), ("train-0", gpus[0].uuid),
                        ("train-0", gpus[1].uuid)]  # one series per GPU and container

    def test_node_series_carry_gkes_labels(self) -> None:
        gpus = (gpu(0, duty=25.0), gpu(1, duty=75.0))
        samples = render(Snapshot(taken_at=0, node_name="gpu-node-1", gpus=gpus))
        node = {k[0]: dict(k[1]) for k in samples if k[0].endswith("_gpu_node")
                and dict(k[1])["accelerator_id"] == gpus[1].uuid}
        expected = {"make": "nvidia", "accelerator_id": gpus[1].uuid,
                    "model": "NVIDIA H100 80GB HBM3"}
        assert node == {name: expected for name in ("duty_cycle_gpu_node",
                                                    "memory_used_gpu_node",
                                                    "memory_total_gpu_node")}

    def test_no_view_renders_the_node_only(self) -> None:
        samples = render(Snapshot(taken_at=0, gpus=(gpu(0),), containers=None,
                                  errors=(("podresources", 3),)))
        assert "duty_cycle" not in names(samples) and "duty_cycle_gpu_node" in names(samples)
        assert samples[("gpu_node_installer_pod_resources_available", frozenset())] == 0
        key = ("gpu_node_installer_collection_errors_total",
               frozenset({("source", "podresources")}))
        assert samples[key] == 3


class TestNode:
    """Our own family from the install's and the agent's facts."""

    def test_install_facts(self) -> None:
        facts = InstallFacts("550.90.07", "open", "6.1.0-27-cloud-amd64", "12.4", "ab" * 32,
                             exit_code=0, fast_path=True, stage_seconds={"load": 1.5})
        samples = render(Snapshot(taken_at=0, install=facts, ready=True,
                                  daemons=(("nv-fabricmanager", False, 3),),
                                  xids=(("0000:3b:00", 79, 2),)))
        info = {"driver_version": "550.90.07", "flavour": "open",
                "kernel": "6.1.0-27-cloud-amd64", "cuda_version": "12.4",
                "package_digest": "ab" * 32}
        assert samples[("gpu_node_installer_info", frozenset(info.items()))] == 1
        assert samples[("gpu_node_installer_install_fast_path", frozenset())] == 1
        assert samples[("gpu_node_installer_install_stage_seconds",
                        frozenset({("stage", "load")}))] == 1.5
        assert samples[("gpu_node_installer_daemon_up",
                        frozenset({("daemon", "nv-fabricmanager")}))] == 0
        assert samples[("gpu_node_installer_daemon_restarts_total",
                        frozenset({("daemon", "nv-fabricmanager")}))] == 3
        assert samples[("gpu_node_installer_xid_errors_total",
                        frozenset({("gpu", "0000:3b:00"), ("xid", "79")}))] == 2

    def test_unknowns_are_absent_not_zero(self) -> None:
        samples = render(Snapshot(taken_at=0, gpus=(gpu(0, duty=None),)))
        assert "gpu_node_installer_ready" not in names(samples)
        assert "gpu_node_installer_last_install_exit_code" not in names(samples)
        assert "gpu_node_installer_gpu_duty_cycle_ratio" not in names(samples)
        assert "gpu_node_installer_gpu_memory_used_bytes" in names(samples)

    def test_a_rendering_bug_costs_the_families_not_the_scrape(self) -> None:
        bad = GpuReading(0, "GPU-x", "m", "b", memory_used=object())  # type: ignore[arg-type]
        log = Log()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(lambda: Snapshot(taken_at=0, gpus=(bad,)), log))
        text = generate_latest(registry).decode()
        assert "gpu_node_installer_info" in text  # the other groups are still served
        assert "gpu_node_installer_ready" in text and "pod_resources_available" in text
        assert "gpu_node_installer_gpu_memory_used_bytes" not in text
        assert log.lines and "metrics rendering failed" in log.lines[0]

    def test_age_is_time_since_the_collection(self) -> None:
        from installer.agent.metrics.families import families

        ages = [s.value for f in families(Snapshot(taken_at=100.0), 107.5) for s in f.samples
                if f.name == "gpu_node_installer_metrics_age_seconds"]
        assert ages == [7.5]


class TestLastInstall:
    """`.last-install.json`: written by `install`, read by the agent; malformed is absent."""

    def test_round_trip(self, tmp_path: Path) -> None:
        write_last_install(tmp_path, LastInstall(12, fast_path=False, stage="verify",
                                                 timings_ms={"detect": 4.0}))
        got = read_last_install(tmp_path)
        assert got is not None and (got.exit_code, got.fast_path, got.stage) == (
            12, False, "verify")
        assert got.timings_ms == {"detect": 4.0} and got.finished_at > 0

    @pytest.mark.parametrize("text", ['{"exit_code": "0", "fast_path": true}',
                                      '{"exit_code": 0, "fast_path": 1}', "[]", "{",
                                      '{"exit_code": 0, "fast_path": true, "stage": 3}'])
    def test_malformed_is_absent(self, tmp_path: Path, text: str) -> None:
        (tmp_path / LAST_INSTALL_FILE).write_text(text)
        assert read_last_install(tmp_path) is None

    def test_absent_and_unwritable(self, tmp_path: Path) -> None:
        assert read_last_install(tmp_path) is None
        (tmp_path / "file").write_text("not a directory")
        write_last_install(tmp_path / "file", LastInstall(0, fast_path=True))  # no raise
        (tmp_path / LAST_INSTALL_FILE).mkdir()  # a directory in its place: not replaced
        write_last_install(tmp_path, LastInstall(0, fast_path=True))
        assert (tmp_path / LAST_INSTALL_FILE).is_dir() and read_last_install(tmp_path) is None


class TestSettings:
    """METRICS_PORT, METRICS_ADDRESS, METRICS_INTERVAL."""

    @pytest.mark.parametrize(("text", "port"), [("0", 0), ("9420", 9420), (" 65535 ", 65535)])
    def test_ports(self, text: str, port: int) -> None:
        assert settings.metrics_port(text) == port

    @pytest.mark.parametrize("text", ["-1", "65536", "94 20", "", "²", "0x10", "9420.0"])
    def test_bad_ports(self, text: str) -> None:
        with pytest.raises(Invalid):
            settings.metrics_port(text)

    @pytest.mark.parametrize(("text", "address"), [("0.0.0.0", "0.0.0.0"), ("::", "::"),
                                                   ("127.0.0.1", "127.0.0.1")])
    def test_addresses(self, text: str, address: str) -> None:
        assert settings.metrics_address(text) == address

    @pytest.mark.parametrize("text", ["localhost", "0.0.0.0:9420", "", "1.2.3"])
    def test_bad_addresses(self, text: str) -> None:
        with pytest.raises(Invalid):
            settings.metrics_address(text)

    def test_interval_bounds(self) -> None:
        assert settings.metrics_interval("5") == 5.0
        for text in ("0.5", "61", "nan", "inf"):
            with pytest.raises(Invalid):
                settings.metrics_interval(text)
        assert not math.isnan(settings.metrics_interval("60"))


class TestServer:
    """The WSGI app on a real server in this process: /healthz follows the snapshot's age."""

    @pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
    def test_healthz_fresh_then_stale(self, address: str) -> None:
        import socket
        import time

        from installer.agent.metrics import server

        if ":" in address and not socket.has_ipv6:
            pytest.skip("this machine has no IPv6")
        snap = [Snapshot(taken_at=time.time())]
        app = server.make_app(lambda: snap[0], interval_s=1.0, log=Log())
        httpd, thread = server.serve(address, 0, app)
        host = f"[{address}]" if ":" in address else address
        base = f"http://{host}:{httpd.server_port}"
        try:
            status, text = http_get(base + "/healthz")
            assert status == 200 and text.startswith("ok"), text
            snap[0] = Snapshot(taken_at=time.time() - 60)  # no collection for a minute
            status, text = http_get(base + "/healthz")
            assert status == 503 and text.startswith("stale"), text
            status, text = http_get(base + "/metrics")
            assert status == 200 and "gpu_node_installer_metrics_age_seconds" in text
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(10)


# GKE's families transcribed here by hand, independently of installer/agent/metrics/gke.py,
# from GoogleCloudPlatform/container-engine-accelerators pkg/gpu/nvidia/metrics/metrics.go
# at 992db81257553607f1477945f1b3219632991829: name -> (Help, label names), all GaugeVecs.
GKE_METRICS_GO = {
    "duty_cycle_gpu_node": ("Percent of time when the GPU was actively processing",
                            ("make", "accelerator_id", "model")),
    "memory_total_gpu_node": ("Total memory available on the GPU in bytes",
                              ("make", "accelerator_id", "model")),
    "memory_used_gpu_node": ("Allocated GPU memory in bytes", ("make", "accelerator_id", "model")),
    "duty_cycle": ("Percent of time when the GPU was actively processing",
                   ("namespace", "pod", "container", "make", "accelerator_id", "model")),
    "memory_total": ("Total memory available on the GPU in bytes",
                     ("namespace", "pod", "container", "make", "accelerator_id", "model")),
    "memory_used": ("Allocated GPU memory in bytes",
                    ("namespace", "pod", "container", "make", "accelerator_id", "model")),
    "request": ("Number of accelerator devices requested by the container",
                ("namespace", "pod", "container", "resource_name")),
}


class TestGkeNames:
    """The product's GKE table against a transcription of metrics.go, and the exposition
    against both."""

    def test_the_table_matches_metrics_go(self) -> None:
        assert gke.FAMILIES == GKE_METRICS_GO

    def test_the_exposition_serves_the_table(self) -> None:
        gpus = (gpu(0), gpu(1))
        snap = Snapshot(taken_at=0, gpus=gpus, containers=(holder("p", "nvidia0"),))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(lambda: snap, Log()))
        families = {f.name: f for f in text_string_to_metric_families(
            generate_latest(registry).decode())}
        for name, (doc, labels) in GKE_METRICS_GO.items():
            family = families[name]
            assert (family.type, family.documentation) == ("gauge", doc)
            # ours on the per-container GPU series: whether the container has the GPU alone
            served = {*labels, "attribution"} if "accelerator_id" in labels and \
                "pod" in labels else set(labels)
            assert family.samples and {frozenset(s.labels) for s in family.samples} == {
                frozenset(served)}
