"""The agent's per-GPU fabric state: the real pynvml over the NVML stand-in's fabric file."""

from __future__ import annotations

from collections.abc import Iterator
from ctypes import byref
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest
from native import build_standins
from native.daemons import write_fabric
from native.nvmlsession import nvml_session

from installer.node.gpufabric import (
    GpuFabric,
    fabric_done,
    fabric_summary,
    not_done,
    not_done_detail,
    read_fabric,
)


@pytest.fixture(scope="module")
def old_libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NVML without nvmlDeviceGetGpuFabricInfoV (branches before R550)."""
    return build_standins(tmp_path_factory.mktemp("nvml-old"), omit_fabric_v=True)


@pytest.fixture(autouse=True)
def _env(fake_env: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    fabric = tmp_path / "fabric"
    fake_env.setenv("FAKE_NVML_FABRIC_FILE", str(fabric))
    yield fabric


def _read(lib_dir: Path) -> list[GpuFabric]:
    with nvml_session(lib_dir):
        return read_fabric()


class TestReadFabric:
    def test_every_state_of_an_eight_gpu_node(self, libs: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "8")
        write_fabric(tmp_path / "fabric", [(3, 0), (3, 0), (3, 0), (3, 0), (3, 0), (2, 0),
                                           (1, 0), (3, 13)])
        gpus = _read(libs)
        assert gpus == [GpuFabric(i, "completed", 0) for i in range(5)] + [
            GpuFabric(5, "in-progress", None), GpuFabric(6, "not-started", None),
            GpuFabric(7, "completed", 13)]
        assert [g.ok for g in gpus] == [True] * 5 + [False] * 3
        assert fabric_summary(gpus) == (
            "8 GPUs: 5 completed, 1 completed-with-error, 1 in-progress, 1 not-started")

    def test_status_is_only_kept_once_completed(self, libs: Path, tmp_path: Path) -> None:
        """NVML's status means nothing before completion: an in-progress GPU with a stale
        status still reads as in-progress, status None."""
        write_fabric(tmp_path / "fabric", [(2, 999)])
        assert _read(libs) == [GpuFabric(0, "in-progress", None)]

    def test_file_is_re_read_on_every_call(self, libs: Path, tmp_path: Path) -> None:
        with nvml_session(libs):
            write_fabric(tmp_path / "fabric", [(1, 0)])
            first = read_fabric()
            write_fabric(tmp_path / "fabric", [(3, 0)])
            second = read_fabric()
        assert (first[0].state, second[0].state) == ("not-started", "completed")

    def test_not_supported_state_is_ok(self, libs: Path, tmp_path: Path) -> None:
        write_fabric(tmp_path / "fabric", [(0, 0)])
        (gpu,) = _read(libs)
        assert (gpu.state, gpu.ok) == ("not-supported", True)

    def test_not_supported_error_is_ok(self, libs: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """Pre-Hopper GPUs answer the call itself with NOT_SUPPORTED."""
        monkeypatch.setenv("FAKE_NVML_GPUS", "2")
        (tmp_path / "fabric").write_text("unsupported\nunsupported\n")
        assert _read(libs) == [GpuFabric(0, "not-supported", None),
                               GpuFabric(1, "not-supported", None)]

    def test_default_state_without_a_file_line(self, libs: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        """GPUs past the file's lines take FAKE_NVML_FABRIC_STATE (the older switch)."""
        monkeypatch.setenv("FAKE_NVML_GPUS", "2")
        monkeypatch.setenv("FAKE_NVML_FABRIC_STATE", "2")
        write_fabric(tmp_path / "fabric", [(3, 0)])
        assert [g.state for g in _read(libs)] == ["completed", "in-progress"]

    def test_falls_back_to_the_unversioned_call(self, old_libs: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "2")
        write_fabric(tmp_path / "fabric", [(3, 0), (2, 0)])
        with nvml_session(old_libs):
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            with pytest.raises(pynvml.NVMLError) as info:
                pynvml.nvmlDeviceGetGpuFabricInfoV(handle, byref(pynvml.c_nvmlGpuFabricInfoV_t()))
            gpus = read_fabric()
        assert info.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        assert gpus == [GpuFabric(0, "completed", 0), GpuFabric(1, "in-progress", None)]

    def test_other_nvml_errors_are_raised_as_they_are(
            self, libs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "2")
        monkeypatch.setenv("FAKE_NVML_DEVICE_ERROR", "1:15")
        with nvml_session(libs), pytest.raises(pynvml.NVMLError) as info:
            read_fabric()
        assert info.value.value == pynvml.NVML_ERROR_GPU_IS_LOST


class TestVersionedStruct:
    """The stand-in checks the struct version as NVML does."""

    def test_v3_carries_a_health_summary(self, libs: Path, tmp_path: Path) -> None:
        (tmp_path / "fabric").write_text("3 0 5\n")
        with nvml_session(libs):
            info = pynvml.c_nvmlGpuFabricInfo_v3_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(0),
                                                   byref(info))
        assert (info.state, info.status, info.healthMask, info.healthSummary) == (3, 0, 5, 1)
        assert bytes(info.clusterUuid) != bytes(16)

    def test_unknown_version_is_refused(self, libs: Path) -> None:
        with nvml_session(libs):
            info = pynvml.c_nvmlGpuFabricInfoV_t()
            info.version = 0x01000020
            with pytest.raises(pynvml.NVMLError) as raised:
                pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(0),
                                                   byref(info))
        assert raised.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


class TestSummary:
    def test_shapes(self) -> None:
        assert fabric_summary([]) == "no GPUs"
        assert fabric_summary([GpuFabric(0, "completed", 0)]) == "1 GPU: 1 completed"
        assert fabric_summary([GpuFabric(i, "in-progress", None) for i in range(6)]
                              + [GpuFabric(6, "completed", 0), GpuFabric(7, "completed", 0)]
                              ) == "8 GPUs: 2 completed, 6 in-progress"

    def test_text_per_gpu(self) -> None:
        assert GpuFabric(3, "completed", 13).text() == "GPU 3: completed with NVML error 13"
        assert GpuFabric(1, "not-started", None).text() == "GPU 1: not-started"


class TestNotDone:
    """Which GPUs CUDA cannot use yet, named by PCI address and state."""

    def test_names_each_gpu_by_pci_address_and_state(self, libs: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "4")
        monkeypatch.setenv("FAKE_NVML_BUS_IDS", "00000000:07:00.0,00000000:0B:00.0,"
                                                "00000000:48:00.0,00000000:4C:00.0")
        write_fabric(tmp_path / "fabric", [(3, 0), (1, 0), (2, 0), (3, 13)])
        gpus = _read(libs)
        assert [g.pci for g in gpus] == ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0",
                                         "0000:4c:00.0"]
        assert not fabric_done(gpus)
        assert not_done_detail(gpus) == ("0000:0b:00.0 not-started, 0000:48:00.0 in-progress, "
                                         "0000:4c:00.0 completed-with-error (NVML error 13)")

    def test_not_supported_among_fabric_gpus_is_not_done(
            self, libs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A GPU answering NOT_SUPPORTED beside GPUs that report a fabric is one NVML cannot
        vouch for: the node is not ready."""
        monkeypatch.setenv("FAKE_NVML_GPUS", "3")
        (tmp_path / "fabric").write_text("3 0\nunsupported\n3 0\n")
        gpus = _read(libs)
        assert [g.index for g in not_done(gpus)] == [1]
        assert not fabric_done(gpus)
        assert "not-supported" in not_done_detail(gpus)

    def test_all_completed_or_no_fabric_at_all_is_done(self) -> None:
        assert fabric_done([GpuFabric(i, "completed", 0) for i in range(8)])
        assert fabric_done([GpuFabric(0, "not-supported", None)])
        assert not fabric_done([])
