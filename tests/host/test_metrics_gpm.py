"""SM activity without DCGM: NVML's GPU Performance Monitoring read through the real pynvml
from the NVML stand-in (tests/native/nvml_standin_gpm.c, after NVIDIA/go-nvml
`gen/nvml/nvml.h` at 2f9e261fe40a7a1c54783d66805e8920564763b4, lines 13803-13960), the
agent's reader of it, the families it renders and the real `agent` serving them."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest
from host.test_agent_metrics import GPUS, gpu_line, metrics_node, served, value
from native.nvmlsession import h100_mig_node, nvml_session
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from installer.agent.metrics.gpm import METRICS, GpmReader
from installer.agent.metrics.server import SnapshotCollector
from installer.agent.metrics.snapshot import GpmReading, GpuReading, Snapshot
from installer.config import agent as settings
from installer.config.values import Invalid
from installer.node.podresources import ContainerDevices
from installer.packages.manifest import Package

ACTIVE = ("sm_active=37.5 sm_occupancy=12.25 tensor_active=80 dram_active=5.5 "
          "graphics_active=95")


class Log:
    """Keeps each line the reader logs."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((event, fields))


def write(path: Path, *lines: str) -> None:
    path.write_text("\n".join(lines) + "\n")


def metrics_get(first: Any, second: Any, *ids: int) -> Any:
    get = pynvml.c_nvmlGpmMetricsGet_t()
    get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(ids)
    get.sample1, get.sample2 = first, second
    for slot, metric in enumerate(ids):
        get.metrics[slot].metricId = metric
    return pynvml.nvmlGpmMetricsGet(get)


@pytest.fixture
def readings(fake_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    path = tmp_path / "nvml-metrics"
    fake_env.setenv("FAKE_NVML_GPUS", "2")
    fake_env.setenv("FAKE_NVML_METRICS_FILE", str(path))
    return path


class TestStandin:
    """The stand-in's GPM calls keep NVML's documented semantics."""

    def test_two_samples_give_the_set_percentages(self, libs: Path, readings: Path) -> None:
        write(readings, ACTIVE, "gpm=unsupported")
        with nvml_session(libs):
            found, errors = GpmReader(Log(), 0.15).read(
                [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)])
        assert errors == []
        assert found["0"].supported and found["0"].values == pytest.approx(
            {"sm_active": 37.5, "sm_occupancy": 12.25, "tensor_active": 80.0,
             "dram_active": 5.5, "graphics_active": 95.0}, rel=1e-9)
        assert not found["1"].supported and found["1"].values == {}
        assert "no GPM" in found["1"].reason

    def test_a_metric_spans_its_interval(self, libs: Path, readings: Path) -> None:
        """Activity that changes between samples: each interval its own percentage, the
        whole interval their time-weighted mean (strictly between them)."""
        write(readings, "sm_active=20")
        sm = pynvml.NVML_GPM_METRIC_SM_UTIL
        with nvml_session(libs):
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            samples = [pynvml.nvmlGpmSampleAlloc() for _ in range(3)]
            pynvml.nvmlGpmSampleGet(handle, samples[0])
            time.sleep(0.12)
            pynvml.nvmlGpmSampleGet(handle, samples[1])
            write(readings, "sm_active=60")
            time.sleep(0.12)
            pynvml.nvmlGpmSampleGet(handle, samples[2])
            first = metrics_get(samples[0], samples[1], sm).metrics[0]
            second = metrics_get(samples[1], samples[2], sm).metrics[0]
            fp64 = pynvml.NVML_GPM_METRIC_FP64_UTIL
            whole = metrics_get(samples[0], samples[2], sm, fp64).metrics
            with pytest.raises(pynvml.NVMLError) as backwards:
                metrics_get(samples[2], samples[0], sm)
            other = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByIndex(1), other)
            with pytest.raises(pynvml.NVMLError) as mixed:
                metrics_get(samples[2], other, sm)
            for sample in (*samples, other):
                pynvml.nvmlGpmSampleFree(sample)
        assert (first.nvmlReturn, second.nvmlReturn) == (0, 0)
        assert first.value == pytest.approx(20.0) and second.value == pytest.approx(60.0)
        assert 20.0 < whole[0].value < 60.0
        assert whole[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # FP64_UTIL: not here
        assert backwards.value.value == mixed.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT

    def test_a_nan_value_is_left_out(self, libs: Path, readings: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """Real NVML (H100, driver 580.159.04) answered DRAM_BW_UTIL NaN, with success, for
        two samples microseconds apart: no reading, not a NaN series."""
        write(readings, ACTIVE)
        real = pynvml.nvmlGpmMetricsGet

        def nan_dram(get: Any) -> Any:
            answer = real(get)
            get.metrics[list(METRICS).index("dram_active")].value = float("nan")
            return answer
        monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", nan_dram)
        with nvml_session(libs):
            found, errors = GpmReader(Log(), 0.15).read(
                [("0", pynvml.nvmlDeviceGetHandleByIndex(0))])
        assert errors == []
        assert "dram_active" not in found["0"].values
        assert found["0"].values["sm_active"] == pytest.approx(37.5)

    def test_unsupported_is_logged_once_and_never_sampled(self, libs: Path,
                                                          readings: Path) -> None:
        write(readings, "gpm=unsupported", "gpm=unsupported")
        log, waits = Log(), []
        reader = GpmReader(log, 0.5, waits.append)
        with nvml_session(libs):
            handles = [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
            for _ in range(3):
                found, errors = reader.read(handles)
        assert errors == [] and waits == []  # nothing to sample: no wait either
        assert all(not reading.supported for reading in found.values())
        said = [fields["uuid"] for event, fields in log.lines if "GPM not supported" in event]
        assert said == ["0", "1"]


def gpu(index: int, gpm: GpmReading | None) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index}", model="NVIDIA H100 80GB HBM3",
                      pci_bus_id=f"00000000:{index + 16:02X}:00.0", gpm=gpm)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def picked(samples: Samples, name: str, **labels: str) -> list[float]:
    """The values of our family `name` whose labels include `labels`."""
    return [v for (n, ls), v in samples.items()
            if n == "gpu_node_installer_" + name and set(labels.items()) <= ls]


def render(snap: Snapshot) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, Log()))
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class TestFamilies:
    """Ratios per GPU, per container only where the container holds the GPU alone, and the
    GPUs without GPM said as such."""

    def test_ratios_per_gpu_and_exact_container(self) -> None:
        active = GpmReading(True, values={"sm_active": 40.0, "tensor_active": 10.0})
        snap = Snapshot(taken_at=0, gpus=(
            gpu(0, active), gpu(1, active), gpu(2, GpmReading(False, "the GPU has no GPM")),
            gpu(3, None)), containers=(
            ContainerDevices("ml", "alone", "main", "nvidia.com/gpu", ("GPU-0",)),
            ContainerDevices("ml", "slice", "main", "nvidia.com/gpu", ("GPU-1::0",)),
            ContainerDevices("ml", "slice2", "main", "nvidia.com/gpu", ("GPU-1::1",))))
        get = partial(picked, render(snap))

        assert get("gpu_sm_active_ratio", gpu="0") == [pytest.approx(0.4)]
        assert get("gpu_tensor_active_ratio", gpu="1") == [pytest.approx(0.1)]
        assert get("gpu_sm_occupancy_ratio") == []  # NVML gave none: absent, not 0
        assert get("gpu_sm_active_ratio", gpu="2") == get("gpu_sm_active_ratio", gpu="3") == []
        assert get("gpu_gpm_supported", gpu="0", reason="") == [1]
        assert get("gpu_gpm_supported", gpu="2", reason="the GPU has no GPM") == [0]
        assert get("gpu_gpm_supported", gpu="3") == []  # GPM off: not asked
        assert get("container_gpu_sm_active_ratio") == [pytest.approx(0.4)]
        assert get("container_gpu_sm_active_ratio", pod="alone", uuid="GPU-0") != []

    def test_metric_table_covers_every_family(self) -> None:
        from installer.agent.metrics.gpmfamilies import GPM
        assert set(GPM) == set(METRICS)


def test_interval_setting() -> None:
    assert settings.metrics_gpm_interval("0") == 0.0
    assert settings.metrics_gpm_interval("0.1") == 0.1
    assert settings.metrics_gpm_interval("10") == 10.0
    for text in ("0.05", "10.5", "-1", "1e0", "nan", ""):
        with pytest.raises(Invalid):
            settings.metrics_gpm_interval(text)


class TestAgent:
    """The real agent on an 8-GPU node: GPM series per GPU; a GPU without GPM is served as
    such and logged once."""

    def test_served_and_unsupported_said(self, tmp_path: Path, package: Package) -> None:
        lines = [f"{gpu_line(i)} sm_active={10 * i + 5} dram_active={i}" for i in range(GPUS)]
        lines[6] += " gpm=unsupported"
        node, base = metrics_node(tmp_path, package, lines, METRICS_GPM_INTERVAL="0.2")
        with node.agent():
            samples = next(served(base, "gpu_node_installer_gpu_sm_active_ratio", gpu="7"))
            next(served(base, "gpu_node_installer_metrics_age_seconds"))  # a second pass
            time.sleep(2.5)
        for i in range(GPUS):
            want = None if i == 6 else pytest.approx((10 * i + 5) / 100)
            assert value(samples, "gpu_node_installer_gpu_sm_active_ratio", gpu=str(i)) == want
            assert value(samples, "gpu_node_installer_gpu_gpm_supported",
                         gpu=str(i)) == (0 if i == 6 else 1)
        assert value(samples, "gpu_node_installer_gpu_dram_active_ratio",
                     gpu="3") == pytest.approx(0.03)
        said = [line for line in node.log().splitlines() if "GPM not supported" in line]
        assert len(said) == 1 and "aaaaaaaa-0000-4000-8000-000000000006" in said[0], said


class TestMigInstances:
    """With MIG on, each GPU instance is sampled (nvmlGpmMigSampleGet, nvml.h line 13943 at
    go-nvml 2f9e261) and served; a container holding an instance alone gets its activity."""

    @pytest.fixture
    def mig_node(self, libs: Path, fake_env: pytest.MonkeyPatch, readings: Path) -> Path:
        h100_mig_node(libs, fake_env.setenv, readings.parent)
        return readings

    def test_each_instance_its_own_activity(self, libs: Path, mig_node: Path) -> None:
        from installer.agent.metrics.nvml import NvmlReader
        with nvml_session(libs):
            gpus = {g.index: g for g in NvmlReader(Log()).read().gpus}
            gis = sorted(set(gpus[1].mig_instances.values()))
            write(mig_node, "sm_active=5", "sm_active=50 " + " ".join(
                f"gi{gi}.sm_active={10 * n + 10} gi{gi}.dram_active={n}"
                for n, gi in enumerate(gis)))
            handles = [(g.uuid, pynvml.nvmlDeviceGetHandleByIndex(g.index))
                       for g in gpus.values()]
            found, errors = GpmReader(Log(), 0.15).read(
                handles, {gpus[0].uuid: [3], gpus[1].uuid: [*gis, 14]})
            gpu1 = pynvml.nvmlDeviceGetHandleByIndex(1)
            whole, part = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(gpu1, whole)
            time.sleep(0.01)
            pynvml.nvmlGpmMigSampleGet(gpu1, gis[0], part)
            with pytest.raises(pynvml.NVMLError) as mixed:
                metrics_get(whole, part, pynvml.NVML_GPM_METRIC_SM_UTIL)
        assert len(gis) == 3 and len(gpus[1].mig_instances) == 3
        reading = found[gpus[1].uuid]
        assert reading.values["sm_active"] == pytest.approx(50.0)
        assert {gi: reading.instances[gi]["sm_active"] for gi in gis} == pytest.approx(
            {gi: 10.0 * n + 10 for n, gi in enumerate(gis)})
        assert reading.instances[gis[2]]["dram_active"] == pytest.approx(2.0)
        assert found[gpus[0].uuid].instances == {}  # MIG off: no such instance
        assert len(errors) == 2 and all("nvmlGpmMigSampleGet" in e for e in errors), errors
        assert "GPU instance 14" in errors[1] and "Not Found" in errors[1]
        assert mixed.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT

    def test_a_container_holding_an_instance_alone(self) -> None:
        whole = GpmReading(True, values={"sm_active": 50.0},
                           instances={7: {"sm_active": 20.0}, 8: {"sm_active": 30.0},
                                      2: {"sm_active": 40.0}})
        mig = GpuReading(index=1, uuid="GPU-1", model="NVIDIA H100 80GB HBM3", pci_bus_id="x",
                         minor=1, gpm=whole, mig_uuids=("MIG-a", "MIG-b", "MIG-c", "MIG-d"),
                         mig_instances={"MIG-a": 7, "MIG-b": 8, "MIG-c": 2, "MIG-d": 2})
        snap = Snapshot(taken_at=0, gpus=(gpu(0, GpmReading(True, values={})), mig),
                        containers=(
            ContainerDevices("ml", "alone", "main", "nvidia.com/mig-1g.10gb", ("MIG-a",)),
            ContainerDevices("ml", "gke", "main", "nvidia.com/gpu", ("nvidia1/gi8",)),
            ContainerDevices("ml", "slice", "main", "nvidia.com/gpu", ("MIG-a::1",)),
            ContainerDevices("ml", "two-ci", "main", "nvidia.com/gpu", ("MIG-c",))))
        get = partial(picked, render(snap))

        assert get("gpu_mig_sm_active_ratio", gpu="1", gpu_instance_id="7") == [
            pytest.approx(0.2)]
        assert len(get("gpu_mig_sm_active_ratio")) == 3
        # MIG-a is also held by a time-sliced replica: not alone; GI 2 has two MIG devices
        assert get("container_gpu_sm_active_ratio", pod="alone") == []
        assert get("container_gpu_sm_active_ratio", pod="two-ci") == []
        assert get("container_gpu_sm_active_ratio", pod="slice") == []
        assert get("container_gpu_sm_active_ratio", pod="gke", uuid="MIG-b") == [
            pytest.approx(0.3)]
        alone = replace(snap, containers=snap.containers[:1])
        assert [v for (n, ls), v in render(alone).items()
                if n.endswith("container_gpu_sm_active_ratio")] == [pytest.approx(0.2)]
