"""What we know about NVIDIA PCI device ids: marketing name, architecture, module flavours.

Sources: the PCI ID repository (pci.ids, vendor 10de) and NVIDIA's open-gpu-kernel-modules
README (which GPUs the open flavour supports; its "Compatible GPUs" table gives the Grace
parts: GH200 2342 and 2348, GB200 2941, GB300 31C2). Unknown ids are never dropped: they are
reported as "unknown model" so an operator sees a new GPU rather than no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class Architecture:
    """A GPU generation and the kernel-module flavours its drivers offer. A Grace superchip
    is its own row (its branches and flavours differ from the PCIe/SXM parts of the same
    generation); `family` is the generation it belongs to, as GPU feature discovery says."""

    name: str
    flavours: tuple[str, ...]
    preferred_flavour: str
    family: str = ""

    @property
    def generation(self) -> str:
        return self.family or self.name


ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture("Kepler", ("proprietary",), "proprietary"),
        Architecture("Maxwell", ("proprietary",), "proprietary"),
        Architecture("Pascal", ("proprietary",), "proprietary"),
        Architecture("Volta", ("proprietary",), "proprietary"),
        Architecture("Turing", ("open", "proprietary"), "proprietary"),
        Architecture("Ampere", ("open", "proprietary"), "proprietary"),
        Architecture("Ada Lovelace", ("open", "proprietary"), "proprietary"),
        Architecture("Hopper", ("open", "proprietary"), "open"),
        Architecture("Blackwell", ("open",), "open"),
        # Grace superchips (aarch64 hosts): NVIDIA supports them with the open modules only
        Architecture("Grace Hopper", ("open",), "open", family="Hopper"),
        Architecture("Grace Blackwell", ("open",), "open", family="Blackwell"),
        Architecture("Grace Blackwell Ultra", ("open",), "open", family="Blackwell"),
        Architecture("unknown", ("open", "proprietary"), "open"),
    )
}

# device id -> (marketing name, architecture)
DEVICES: dict[int, tuple[str, str]] = {
    0x102D: ("Tesla K80", "Kepler"),
    0x13F2: ("Tesla M60", "Maxwell"),
    0x1BB3: ("Tesla P4", "Pascal"),
    0x15F7: ("Tesla P100 PCIe 12GB", "Pascal"),
    0x15F8: ("Tesla P100 PCIe 16GB", "Pascal"),
    0x15F9: ("Tesla P100 SXM2 16GB", "Pascal"),
    0x1DB1: ("Tesla V100 SXM2 16GB", "Volta"),
    0x1DB4: ("Tesla V100 PCIe 16GB", "Volta"),
    0x1DB5: ("Tesla V100 SXM2 32GB", "Volta"),
    0x1DB6: ("Tesla V100 PCIe 32GB", "Volta"),
    0x1EB8: ("Tesla T4", "Turing"),
    0x20B0: ("A100 SXM4 40GB", "Ampere"),
    0x20B2: ("A100 SXM4 80GB", "Ampere"),
    0x20B5: ("A100 PCIe 80GB", "Ampere"),
    0x20B7: ("A30", "Ampere"),
    0x20F1: ("A100 PCIe 40GB", "Ampere"),
    0x2236: ("A10", "Ampere"),
    0x25B6: ("A2", "Ampere"),
    0x26B5: ("L40", "Ada Lovelace"),
    0x26B9: ("L40S", "Ada Lovelace"),
    0x27B8: ("L4", "Ada Lovelace"),
    0x2321: ("H100 NVL", "Hopper"),
    0x2330: ("H100 SXM5 80GB", "Hopper"),
    0x2331: ("H100 PCIe", "Hopper"),
    0x2335: ("H200 SXM 141GB", "Hopper"),
    0x2342: ("GH200 120GB/480GB", "Grace Hopper"),
    0x2348: ("GH200 144G HBM3e", "Grace Hopper"),
    0x2901: ("B200", "Blackwell"),
    0x2941: ("GB200", "Grace Blackwell"),
    0x31C2: ("GB300", "Grace Blackwell Ultra"),
}

UNKNOWN_MODEL = "unknown model"


def lookup(device_id: int) -> tuple[str, Architecture]:
    """Name and architecture of a device id; unknown ids get 'unknown model'."""
    name, arch = DEVICES.get(device_id, (UNKNOWN_MODEL, "unknown"))
    return name, ARCHITECTURES[arch]
