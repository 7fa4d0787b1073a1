"""Which fabric a node has (none / NVSwitch / NVLink5), decided from host trees in the
shapes sysfs and procfs really have, and shown by `detect` and `status` (real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import node_args

from installer.node.fabric import fabric_kind, missing_ib_modules, read_fabric_facts
from installer.node.host import RealHost, Roots
from installer.testing import (
    IbSpec,
    NodeSpec,
    PciSpec,
    build_node,
    nic_vpd,
    switch_vpd,
    vpd_bytes,
)

NodeMaker = Callable[[str], Path]
REPO = Path(__file__).resolve().parents[2]
NVSWITCH_TEXT = "Fabric:          NVSwitch (needs Fabric Manager)"
NVLINK5_TEXT = ("Fabric:          NVLink5 (needs Fabric Manager and NVLink Subnet Manager); "
                "InfiniBand modules not loaded: mlx5_core, ib_umad")


def _host(root: Path) -> RealHost:
    return RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def _nvswitch_proc(root: Path, *addresses: str) -> None:
    """What the loaded nvidia-nvswitch driver shows: one entry per NVSwitch."""
    devices = root / "proc" / "driver" / "nvidia-nvswitch" / "devices"
    devices.mkdir(parents=True)
    for address in addresses:
        (devices / address).write_text("BIOS Version: 96.10.6D.00.01\n")


def _gpus_only(tmp_path: Path, *, infiniband: tuple[IbSpec, ...] = ()) -> Path:
    """An H100 node whose NVSwitches do not show on PCI (only the driver's proc tree)."""
    spec = NodeSpec(os="ubuntu-22.04", kernel="5.15.0-105-generic",
                    pci=tuple(PciSpec(f"0000:{b}:00.0", 0x2330, 0x030200) for b in ("18", "2a")),
                    infiniband=infiniband)
    return build_node(tmp_path / "node", spec)


def _cli(root: Path, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TERMINATION_LOG": str(tmp_path / "termination-log")}
    return subprocess.run([sys.executable, "-m", "installer", *args, *node_args(root)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


class TestKind:
    def test_nvlink5_from_switch_management_vpd(self, make_node: NodeMaker) -> None:
        facts = read_fabric_facts(_host(make_node("ubuntu-b200x8")))
        assert facts.kind == "nvlink5"
        assert facts.switch_ports == ("mlx5_1",)  # mlx5_0 is an ordinary NIC
        assert facts.daemons == ("nvlsm", "nv-fabricmanager")

    def test_nvswitch_from_pci_functions_before_the_driver_loads(
            self, make_node: NodeMaker) -> None:
        facts = read_fabric_facts(_host(make_node("gke-cos-a100x8")))
        assert (facts.kind, facts.nvswitch_functions, facts.nvswitch_devices) == (
            "nvswitch", 6, 0)
        assert facts.daemons == ("nv-fabricmanager",)

    def test_nvswitch_from_the_drivers_proc_entries(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path)
        assert fabric_kind(_host(root)) == "none"
        _nvswitch_proc(root, "0000:05:00.0", "0000:06:00.0")
        facts = read_fabric_facts(_host(root))
        assert (facts.kind, facts.nvswitch_devices, facts.nvswitch_functions) == (
            "nvswitch", 2, 0)

    def test_empty_nvswitch_proc_dir_is_no_fabric(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path)
        _nvswitch_proc(root)
        assert fabric_kind(_host(root)) == "none"

    def test_nvlink5_wins_over_nvswitch_evidence(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path, infiniband=(IbSpec("mlx5_4", "0000:9c:00.0",
                                                       switch_vpd()),))
        _nvswitch_proc(root, "0000:05:00.0")
        assert fabric_kind(_host(root)) == "nvlink5"

    def test_nics_without_switch_management_are_not_nvlink5(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path, infiniband=(
            IbSpec("mlx5_0", "0000:1a:00.0", nic_vpd()),
            IbSpec("mlx5_1", "0000:1b:00.0", b"")))  # a device with an empty VPD
        assert fabric_kind(_host(root)) == "none"

    @pytest.mark.parametrize("name", ["gke-ubuntu-t4", "debian12-l4", "debian12-no-gpu"])
    def test_plain_nodes_need_nothing(self, make_node: NodeMaker, name: str) -> None:
        facts = read_fabric_facts(_host(make_node(name)))
        assert (facts.kind, facts.daemons) == ("none", ())

    def test_unreadable_vpd_is_reported_not_fatal(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path, infiniband=(IbSpec("mlx5_0", "0000:1a:00.0", b""),))
        vpd = root / "sys/devices/pci0000:00/0000:1a:00.0/vpd"
        vpd.unlink()
        vpd.mkdir()  # reading it fails with an OSError, as an unanswering device's EIO does
        facts = read_fabric_facts(_host(root))
        assert (facts.kind, facts.unreadable_vpd) == ("none", ("mlx5_0",))


class TestVpdContent:
    """Binary VPD images as sysfs returns them: the name may sit anywhere among them."""

    @pytest.mark.parametrize(("vpd", "kind"), [
        (switch_vpd(), "nvlink5"),  # in the identifier string and the part number
        (vpd_bytes("ConnectX-8", PN="900-9X81Q", V3="\0\0SW_MNG\0\0"), "nvlink5"),
        (bytes(32760) + b"SW_MNG", "nvlink5"),  # at the very end of the largest VPD
        (vpd_bytes("ConnectX-7", PN="MCX75310AAS", V2="SW_MN"), "none"),
        (switch_vpd()[:20], "none"),  # a short read that stops before the name
        (b"\xff" * 64, "none"),  # a device that answers all ones
    ])
    def test_switch_management_name_in_binary_vpd(self, tmp_path: Path, vpd: bytes,
                                                  kind: str) -> None:
        root = _gpus_only(tmp_path, infiniband=(IbSpec("mlx5_0", "0000:1a:00.0", vpd),))
        assert fabric_kind(_host(root)) == kind

    def test_vpd_image_has_the_pci_layout(self) -> None:
        """The fixture's image is what a device returns: identifier (0x82), read-only
        keywords (0x90) whose RV checksum makes them sum to zero, end tag (0x78)."""
        data = switch_vpd()
        assert data[0] == 0x82 and data[-1] == 0x78
        rv = data.index(b"RV")
        assert sum(data[:rv + 4]) % 256 == 0


class TestInfinibandModules:
    LINE = "{} 2355200 1 - Live 0xffffffffc0a00000\n"

    def test_none_loaded(self, make_node: NodeMaker) -> None:
        assert missing_ib_modules(_host(make_node("ubuntu-b200x8"))) == ["mlx5_core",
                                                                           "ib_umad"]

    def test_one_loaded(self, make_node: NodeMaker) -> None:
        root = make_node("ubuntu-b200x8")
        (root / "proc/modules").write_text(self.LINE.format("mlx5_core")
                                           + self.LINE.format("mlxfw"))
        assert missing_ib_modules(_host(root)) == ["ib_umad"]

    def test_both_loaded(self, make_node: NodeMaker) -> None:
        root = make_node("ubuntu-b200x8")
        (root / "proc/modules").write_text(self.LINE.format("ib_umad")
                                           + self.LINE.format("mlx5_core"))
        assert missing_ib_modules(_host(root)) == []

    def test_built_in_module_counts_as_loaded(self, make_node: NodeMaker) -> None:
        root = make_node("ubuntu-b200x8")
        (root / "proc/modules").write_text(self.LINE.format("mlx5_core"))
        params = root / "sys/module/ib_umad/parameters"
        params.mkdir(parents=True)
        (params / "debug_level").write_text("0\n")
        assert missing_ib_modules(_host(root)) == []

    def test_kernel_without_module_support(self, make_node: NodeMaker) -> None:
        root = make_node("ubuntu-b200x8")
        (root / "proc/modules").unlink()
        assert missing_ib_modules(_host(root)) == ["mlx5_core", "ib_umad"]


class TestShown:
    """`detect` and `status`, the real CLI in a subprocess."""

    @pytest.mark.parametrize(("name", "line"), [
        ("ubuntu-b200x8", NVLINK5_TEXT), ("gke-cos-a100x8", NVSWITCH_TEXT),
        ("gke-ubuntu-t4", "Fabric:          none")])
    def test_detect_text(self, make_node: NodeMaker, tmp_path: Path, name: str,
                         line: str) -> None:
        result = _cli(make_node(name), "detect", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert line in result.stdout.splitlines()

    def test_status_shows_what_the_subnet_manager_waits_for(
            self, make_node: NodeMaker, tmp_path: Path) -> None:
        root = make_node("ubuntu-b200x8")
        (root / "proc/modules").write_text(
            "mlx5_core 2355200 1 - Live 0xffffffffc0a00000\n")
        result = _cli(root, "status", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert ("Fabric:          NVLink5 (needs Fabric Manager and NVLink Subnet Manager); "
                "InfiniBand modules not loaded: ib_umad") in result.stdout.splitlines()
        (root / "proc/modules").write_text(
            "mlx5_core 2355200 1 - Live 0xffffffffc0a00000\n"
            "ib_umad 45056 0 - Live 0xffffffffc0b00000\n")
        result = _cli(root, "status", "--output", "json", tmp_path=tmp_path)
        assert json.loads(result.stdout)["node"]["fabric"]["missing_ib_modules"] == []

    def test_detect_json(self, make_node: NodeMaker, tmp_path: Path) -> None:
        result = _cli(make_node("ubuntu-b200x8"), "detect", "--output", "json",
                      tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["fabric"] == {
            "kind": "nvlink5", "needs": ["nvlsm", "nv-fabricmanager"],
            "switch_management_ports": ["mlx5_1"], "nvswitch_devices": 0,
            "nvswitch_functions": 0, "unreadable_vpd": [],
            "missing_ib_modules": ["mlx5_core", "ib_umad"]}

    def test_status_text_and_json(self, make_node: NodeMaker, tmp_path: Path) -> None:
        root = make_node("gke-cos-a100x8")
        text = _cli(root, "status", tmp_path=tmp_path)
        assert text.returncode == 0, text.stderr
        assert NVSWITCH_TEXT in text.stdout.splitlines()
        report = json.loads(_cli(root, "status", "--output", "json",
                                 tmp_path=tmp_path).stdout)
        assert report["node"]["fabric"]["kind"] == "nvswitch"
        assert report["node"]["fabric"]["needs"] == ["nv-fabricmanager"]

    def test_unreadable_vpd_note_in_detect(self, tmp_path: Path) -> None:
        root = _gpus_only(tmp_path, infiniband=(IbSpec("mlx5_0", "0000:1a:00.0", b""),))
        vpd = root / "sys/devices/pci0000:00/0000:1a:00.0/vpd"
        vpd.unlink()
        vpd.mkdir()
        result = _cli(root, "detect", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert any(line.startswith("Note: cannot read the VPD of InfiniBand device(s) mlx5_0")
                   for line in result.stdout.splitlines())

