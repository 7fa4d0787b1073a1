"""Which NVLink fabric this node has, and so which NVIDIA daemons its GPUs need.

Decided from sysfs and procfs as NVIDIA's driver container decides it, NVLink5 first:
- NVLink5 (HGX B200, GB200 NVL): an InfiniBand function whose VPD names the NVSwitch
  management port (`SW_MNG`) needs the NVLink Subnet Manager and Fabric Manager, which can
  only start once `mlx5_core` and `ib_umad` are loaded;
- NVSwitch (HGX A100/H100/H200): `/proc/driver/nvidia-nvswitch/devices` has entries, or
  (before the driver is loaded, so `detect` can tell early) NVSwitch PCI functions exist;
  Fabric Manager alone;
- anything else needs neither.
Read only, through the host seam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from installer.errors import UnsupportedNodeError
from installer.node import kmod, pci
from installer.node.host import Host

FabricKind = Literal["none", "nvswitch", "nvlink5"]

FABRIC_MANAGER = "nv-fabricmanager"
SUBNET_MANAGER = "nvlsm"
IB_MODULES = ("mlx5_core", "ib_umad")
SWITCH_MANAGEMENT = b"SW_MNG"
# PCI VPD addresses are 15 bits: no VPD is longer than this.
VPD_LIMIT = 32768

_NEEDS: dict[str, tuple[str, ...]] = {
    "none": (), "nvswitch": (FABRIC_MANAGER,), "nvlink5": (SUBNET_MANAGER, FABRIC_MANAGER)}
_TEXT = {
    "none": "none",
    "nvswitch": "NVSwitch (needs Fabric Manager)",
    "nvlink5": "NVLink5 (needs Fabric Manager and NVLink Subnet Manager)",
}


@dataclass(frozen=True)
class FabricFacts:
    """The fabric decision and the evidence for it (shown by `detect` and `status`)."""

    kind: FabricKind
    switch_ports: tuple[str, ...] = ()
    nvswitch_devices: int = 0
    nvswitch_functions: int = 0
    unreadable_vpd: tuple[str, ...] = ()
    missing_modules: tuple[str, ...] = ()  # NVLink5 only: what the Subnet Manager waits for

    @property
    def daemons(self) -> tuple[str, ...]:
        """The daemons this fabric needs, in start order (the Subnet Manager first)."""
        return _NEEDS[self.kind]

    @property
    def text(self) -> str:
        waiting = (f"; InfiniBand modules not loaded: {', '.join(self.missing_modules)}"
                   if self.missing_modules else "")
        return describe(self.kind) + waiting

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "needs": list(self.daemons),
                "switch_management_ports": list(self.switch_ports),
                "nvswitch_devices": self.nvswitch_devices,
                "nvswitch_functions": self.nvswitch_functions,
                "unreadable_vpd": list(self.unreadable_vpd),
                "missing_ib_modules": list(self.missing_modules)}


def describe(kind: FabricKind) -> str:
    """One phrase for a fabric kind: what it is and what it needs."""
    return _TEXT[kind]


def fabric_kind(host: Host) -> FabricKind:
    """none, nvswitch or nvlink5 (see the module docstring for the rules)."""
    return read_fabric_facts(host).kind


def read_fabric_facts(host: Host, *, nvswitch_functions: int | None = None) -> FabricFacts:
    """The decision with its evidence; `nvswitch_functions` when the caller has scanned PCI."""
    ports, unreadable = _switch_management_ports(host)
    devices = len(list(host.iterdir(host.roots.proc / "driver" / "nvidia-nvswitch" / "devices")))
    if nvswitch_functions is None:
        nvswitch_functions = len([f for f in pci.scan(host) if f.kind == pci.KIND_NVSWITCH])
    kind: FabricKind = ("nvlink5" if ports else
                        "nvswitch" if devices or nvswitch_functions else "none")
    missing = tuple(missing_ib_modules(host)) if kind == "nvlink5" else ()
    return FabricFacts(kind, tuple(ports), devices, nvswitch_functions, tuple(unreadable),
                       missing)


def _switch_management_ports(host: Host) -> tuple[list[str], list[str]]:
    """InfiniBand devices whose VPD names SW_MNG, and those whose VPD could not be read.

    Like NVIDIA, the raw VPD bytes are searched (a vendor may put the name in any field);
    a VPD that cannot be read (EIO from a device that does not answer, or `detect` run
    unprivileged) is reported, not fatal.
    """
    ports, unreadable = [], []
    for device in host.iterdir(host.roots.sys / "class" / "infiniband"):
        try:
            data = host.read_bytes(device / "device" / "vpd", VPD_LIMIT)
        except (OSError, UnsupportedNodeError):  # EIO; or not root (VPD is mode 0600)
            unreadable.append(device.name)
            continue
        if data is not None and SWITCH_MANAGEMENT in data:
            ports.append(device.name)
    return ports, unreadable


def missing_ib_modules(host: Host) -> list[str]:
    """Of mlx5_core and ib_umad, those the kernel has not loaded (built-in ones count as
    loaded: they have a /sys/module directory but no /proc/modules line)."""
    loaded = {m.name for m in kmod.loaded_modules(host) or []}
    return [name for name in IB_MODULES
            if name not in loaded and not any(host.iterdir(host.roots.sys / "module" / name))]
