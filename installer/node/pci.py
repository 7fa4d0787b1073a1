"""Find NVIDIA PCI functions in sysfs and classify them (GPU, NVSwitch, audio, other).

Every NVIDIA function is reported; only class 0x0300xx/0x0302xx counts as a GPU, so the
HDMI audio function of a GPU and the NVSwitches of an HGX board never inflate the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from installer.node import gpus
from installer.node.host import Host

KIND_GPU = "gpu"
KIND_NVSWITCH = "nvswitch"
KIND_AUDIO = "audio"
KIND_OTHER = "other"


@dataclass(frozen=True)
class PciFunction:
    """One NVIDIA PCI function as sysfs describes it."""

    pci_address: str
    device_id: str
    class_code: str
    kind: str
    name: str
    architecture: str
    driver: str
    numa_node: int | None
    flavours: tuple[str, ...]
    preferred_flavour: str


def classify(class_code: int) -> str:
    """Map a 24-bit PCI class code to our kinds."""
    base_sub = class_code >> 8
    if base_sub in (0x0300, 0x0302):
        return KIND_GPU
    if base_sub == 0x0680:
        return KIND_NVSWITCH
    if base_sub == 0x0403:
        return KIND_AUDIO
    return KIND_OTHER


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def scan(host: Host) -> list[PciFunction]:
    """Every NVIDIA function under <sys>/bus/pci/devices, sorted by address."""
    found = []
    for device_dir in host.iterdir(host.roots.sys / "bus" / "pci" / "devices"):
        if _hex(host.read_text(device_dir / "vendor")) != gpus.NVIDIA_VENDOR:
            continue
        device_id = _hex(host.read_text(device_dir / "device")) or 0
        class_code = _hex(host.read_text(device_dir / "class")) or 0
        kind = classify(class_code)
        name, arch = gpus.lookup(device_id)
        is_gpu = kind == KIND_GPU
        found.append(PciFunction(
            pci_address=device_dir.name,
            device_id=f"{device_id:04x}",
            class_code=f"{class_code:06x}",
            kind=kind,
            name=name if is_gpu else _non_gpu_name(kind),
            architecture=arch.name if is_gpu else "",
            driver=_bound_driver(host, device_dir),
            numa_node=_numa(host.read_text(device_dir / "numa_node")),
            flavours=arch.flavours if is_gpu else (),
            preferred_flavour=arch.preferred_flavour if is_gpu else "",
        ))
    return found


def _non_gpu_name(kind: str) -> str:
    return {KIND_NVSWITCH: "NVSwitch", KIND_AUDIO: "HD audio controller"}.get(
        kind, "NVIDIA device")


def _bound_driver(host: Host, device_dir: Path) -> str:
    target = host.readlink(device_dir / "driver")
    return target.rstrip("/").rsplit("/", 1)[-1] if target else "none"


def _numa(text: str | None) -> int | None:
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def bus_key(bus_id: str) -> str:
    """NVML's `00000000:07:00.0` and sysfs's `0000:07:00.0` as one form, to match them."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id.strip().lower()
