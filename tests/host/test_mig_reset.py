"""A GPU reset for a pending MIG mode, the way mig-parted does it: with the driver loaded,
`nvidia-smi -r -i <bus id>` for that GPU only, never the PCI sysfs reset; without the
driver, the sysfs reset (cmd/nvidia-mig-parted/util/device.go @ bd7160f4, ResetAllGPUs).

The node-level case runs the installer on the NVML stand-in (its nvidia-smi stand-in turns
`-r -i` into the stand-in's reset of that GPU); the seam's cases run `gpureset` on a temp
host root with a recording nvidia-smi."""

from __future__ import annotations

import json
from pathlib import Path

from mignode import A100_40, mig_node

from installer.node.gpureset import reset_gpu
from installer.node.host import RealHost, Roots

BUS = "00000000:11:00.0"
SYSFS = "0000:11:00.0"


class TestOnTheNode:
    def test_only_the_gpu_whose_mode_waits_is_reset_through_the_driver(
            self, tmp_path: Path) -> None:
        """Two A100s, GPU 0 already in MIG mode: only GPU 1's mode waits, so only GPU 1 is
        reset, by nvidia-smi; the PCI sysfs reset files are never written."""
        node = mig_node(tmp_path, A100_40, 2)
        (node.mig_dir / "gpu0").write_text("mode 1 1\n")
        devices = node.scene.root / "sys/bus/pci/devices"
        for device in devices.iterdir():  # a plain file: any write would show in it
            (device / "reset").unlink()
            (device / "reset").write_text("")
        config = node.scene.root / "etc/nvidia/gpu_config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"GPUPartitionSize": "1g.5gb"}))
        done = node.install()
        assert done.returncode == 0, done.stderr
        assert node.smi_calls() == [f"-r -i {SYSFS}"]
        assert [(d / "reset").read_text() for d in sorted(devices.iterdir())] == ["", ""]
        assert node.gis(0) == node.gis(1) == [(gi, 0) for gi in range(7, 14)]
        assert "method=nvidia-smi" in done.stderr or '"method": "nvidia-smi"' in done.stderr


def _host(tmp_path: Path, modules: str) -> tuple[RealHost, Path, Path, Path]:
    """A host root with /proc/modules, the GPU's sysfs reset file, an installed nvidia-smi
    that records its arguments; returns (host, install root, reset file, smi log)."""
    roots = Roots(tmp_path / "host", tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    for root in (roots.host, roots.proc, roots.dev):
        root.mkdir(parents=True)
    (roots.proc / "modules").write_text(modules)
    reset = roots.sys / "bus/pci/devices" / SYSFS / "reset"
    reset.parent.mkdir(parents=True)
    reset.write_text("")
    install = roots.host / "home/kubernetes/bin/nvidia"
    smi = install / "bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    log = tmp_path / "smi.log"
    smi.write_text(f'#!/bin/sh\necho "$LD_LIBRARY_PATH $*" >> {log}\n')
    smi.chmod(0o755)
    return RealHost(roots), install, reset, log


NVIDIA = ("nvidia_uvm 1 0 - Live 0x0 (POE)\n"
          "nvidia 56 1 nvidia_uvm, Live 0x0 (POE)\n")


class TestSeam:
    def test_driver_loaded_resets_through_nvidia_smi_not_sysfs(self, tmp_path: Path) -> None:
        host, install, reset, log = _host(tmp_path, NVIDIA)
        done = reset_gpu(host, BUS, install)
        assert (done.method, done.error) == ("nvidia-smi", None)
        assert log.read_text().splitlines() == [f"{install / 'lib64'} -r -i {SYSFS}"]
        assert reset.read_text() == ""

    def test_without_the_driver_the_pci_function_is_reset(self, tmp_path: Path) -> None:
        host, install, reset, log = _host(tmp_path, "nvidia_uvm 1 0 - Live 0x0\n")
        done = reset_gpu(host, BUS, install)
        assert (done.method, done.error) == ("pci", None)
        assert reset.read_text() == "1"
        assert not log.exists()

    def test_a_refused_reset_is_reported_not_retried_through_sysfs(
            self, tmp_path: Path) -> None:
        host, install, reset, _ = _host(tmp_path, NVIDIA)
        (install / "bin/nvidia-smi").write_text(
            "#!/bin/sh\necho 'Unable to reset GPU: in use' >&2\nexit 1\n")
        done = reset_gpu(host, BUS, install)
        assert done.method == "nvidia-smi"
        assert done.error == "exit 1: Unable to reset GPU: in use"
        assert reset.read_text() == ""
