"""The detect stage over host trees in the real shapes of real nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from installer.errors import NoGpuError
from installer.node.facts import NodeInfo, detect_node
from installer.node.host import RealHost, Roots
from installer.stages.detect import require_gpus


def _detect(root: Path) -> NodeInfo:
    return detect_node(RealHost(Roots(root, root / "proc", root / "sys", root / "dev")))


NodeMaker = Callable[[str], Path]


class TestGpuInventory:
    def test_hgx_a100_counts_gpus_and_nvswitches_not_audio(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("gke-cos-a100x8"))
        assert len(node.gpus) == 8
        assert len(node.nvswitches) == 6
        assert {g.name for g in node.gpus} == {"A100 SXM4 40GB"}
        assert {g.architecture for g in node.gpus} == {"Ampere"}
        audio = [f for f in node.functions if f.kind == "audio"]
        assert len(audio) == 8 and all(f.pci_address.endswith(".1") for f in audio)
        assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert {g.driver for g in node.gpus} == {"none"}  # no module loaded: none bound

    def test_h100x8(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("rocky9-h100x8"))
        assert len(node.gpus) == 8 and len(node.nvswitches) == 4
        assert node.gpus[0].architecture == "Hopper"
        assert node.gpus[0].preferred_flavour == "open"

    @pytest.mark.parametrize(("name", "device", "model", "arch"), [
        ("gke-ubuntu-t4", "1eb8", "Tesla T4", "Turing"),
        ("debian12-l4", "27b8", "L4", "Ada Lovelace"),
    ])
    def test_single_gpu(self, make_node: NodeMaker, name: str, device: str, model: str,
                        arch: str) -> None:
        (gpu,) = _detect(make_node(name)).gpus
        assert (gpu.device_id, gpu.name, gpu.architecture, gpu.driver) == (
            device, model, arch, "none")

    def test_unknown_future_device_is_reported_not_dropped(self, make_node: NodeMaker) -> None:
        (gpu,) = _detect(make_node("debian12-future-gpu")).gpus
        assert (gpu.device_id, gpu.name, gpu.architecture) == ("2f00", "unknown model",
                                                               "unknown")

    def test_nouveau_and_vfio_bindings_with_notes(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("al2023-nouveau-vfio"))
        assert [g.driver for g in node.gpus] == ["nouveau", "vfio-pci"]
        assert any("nouveau" in n and "blacklist" in n for n in node.notes)
        assert any("vfio-pci" in n for n in node.notes)

    def test_no_gpu_node(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("debian12-no-gpu"))
        assert node.gpus == [] and node.nvswitches == []
        with pytest.raises(NoGpuError) as info:
            require_gpus(node)
        assert info.value.code == 3


class TestOsKernelSecurity:
    def test_cos(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("gke-cos-a100x8"))
        assert (node.os.id, node.os.cos_milestone, node.os.cos_build) == (
            "cos", "109", "17800.218.20")
        assert (node.kernel_release, node.kernel_arch) == ("6.1.58+", "x86_64")

    def test_secure_boot_from_efivars(self, make_node: NodeMaker) -> None:
        node = _detect(make_node("debian12-l4"))
        assert node.security.secure_boot is True
        assert node.security.requires_signed_modules

    def test_sig_enforce_and_lockdown(self, make_node: NodeMaker) -> None:
        security = _detect(make_node("rocky9-h100x8")).security
        assert security.module_sig_enforce is True
        assert security.lockdown == "integrity"
        assert security.secure_boot is None

    def test_sig_enforce_from_cmdline_only(self, make_node: NodeMaker) -> None:
        root = make_node("gke-ubuntu-t4")
        (root / "sys/module/module/parameters/sig_enforce").write_text("N\n")
        (root / "proc/cmdline").write_text("ro quiet module.sig_enforce=1\n")
        assert _detect(root).security.module_sig_enforce is True

    def test_relaxed_node(self, make_node: NodeMaker) -> None:
        security = _detect(make_node("gke-ubuntu-t4")).security
        assert not security.requires_signed_modules
        assert security.lockdown == "none"


class TestLoadedDriver:
    def test_nvrm_version_file(self, make_node: NodeMaker) -> None:
        root = make_node("gke-ubuntu-t4")
        version = root / "proc/driver/nvidia/version"
        version.parent.mkdir(parents=True)
        version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  "
                           "Wed Jul  2 20:08:55 UTC 2025\n")
        driver = _detect(root).loaded_driver
        assert driver is not None and driver.version == "535.261.03"

    def test_sys_module_version_fallback(self, make_node: NodeMaker) -> None:
        root = make_node("gke-ubuntu-t4")
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text("550.54.14\n")
        driver = _detect(root).loaded_driver
        assert driver is not None and driver.version == "550.54.14"

    def test_none_loaded(self, make_node: NodeMaker) -> None:
        assert _detect(make_node("gke-ubuntu-t4")).loaded_driver is None

    def test_json_contract_keys(self, make_node: NodeMaker) -> None:
        data = _detect(make_node("gke-cos-a100x8")).to_dict()
        assert data["os"]["id"] == "cos" and data["os"]["version_id"] == "109"
        assert data["kernel"]["release"] == "6.1.58+" and data["kernel"]["arch"] == "x86_64"
        assert set(data["gpus"][0]) >= {"pci_address", "device_id", "name", "architecture",
                                        "driver"}
        assert data["loaded_driver"]["version"] is None
        assert set(data["security"]) >= {"secure_boot", "module_sig_enforce", "lockdown"}
