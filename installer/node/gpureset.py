"""A GPU reset the way NVIDIA's mig-parted does it, through the host seam.

mig-parted (cmd/nvidia-mig-parted/util/device.go @ bd7160f4, `ResetAllGPUs`): with the
`nvidia` module loaded (a line of /proc/modules) the reset goes through the driver,
`nvidia-smi -r -i <PCI bus id>`; only without the driver does it write the PCI function's
sysfs `reset`. A sysfs reset under a loaded driver pulls the device from under it, so it
is never written then. Here one GPU is reset per call: the one whose mode waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from installer.node import kmod, pci
from installer.node.host import Host

SMI_TIMEOUT = 120.0  # nvidia-smi -r waits for the GPU to come back


@dataclass(frozen=True)
class ResetOutcome:
    """How the GPU was reset (`nvidia-smi` or `pci`) and, when it failed, why."""

    method: str
    error: str | None = None


def driver_loaded(host: Host) -> bool:
    """Is the `nvidia` module loaded (mig-parted's `IsNvidiaModuleLoaded`)?"""
    modules = kmod.loaded_modules(host) or []
    return any(m.name == "nvidia" for m in modules)


def reset_gpu(host: Host, pci_bus_id: str, install_root: Path) -> ResetOutcome:
    """Reset one GPU: through the driver's `nvidia-smi -r -i <bus id>` (the installed one,
    with the installed libraries) where the driver is loaded, else the PCI sysfs reset."""
    if driver_loaded(host):
        smi = install_root / "bin" / "nvidia-smi"
        done = host.run(["env", f"LD_LIBRARY_PATH={install_root / 'lib64'}", str(smi),
                         "-r", "-i", pci.bus_key(pci_bus_id)], timeout=SMI_TIMEOUT)
        if done.returncode == 0:
            return ResetOutcome("nvidia-smi")
        last = (done.stderr or done.stdout).strip().splitlines()
        return ResetOutcome("nvidia-smi", f"exit {done.returncode}: "
                                          f"{last[-1] if last else 'no output'}")
    path = host.roots.sys / "bus/pci/devices" / pci.bus_key(pci_bus_id) / "reset"
    try:
        host.write_sysfs(path, "1")
    except OSError as exc:  # no reset method, or refused
        return ResetOutcome("pci", exc.strerror or str(exc))
    return ResetOutcome("pci")
