"""Test helpers shipped with the package: host trees in the real shapes of real nodes.

`build_node(root, SAMPLE_NODES["gke-cos-a100x8"])` writes etc/os-release, proc/ and sys/
(PCI devices as sysfs lays them out, with relative driver symlinks) under `root`, so the
real `RealHost` reads them exactly as it reads a node. `python -m installer.testing NAME DIR`
writes one for a person to explore (`make sample` does this).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

OS_RELEASES: dict[str, str] = {
    "cos": (
        'NAME="Container-Optimized OS"\nID=cos\nPRETTY_NAME="Container-Optimized OS from '
        'Google"\nHOME_URL="https://cloud.google.com/container-optimized-os/docs"\n'
        "GOOGLE_METRICS_PRODUCT_ID=26\nGOOGLE_CRASH_ID=Lakitu\nVERSION=109\n"
        "VERSION_ID=109\nBUILD_ID=17800.218.20\n"),
    "ubuntu-22.04": (
        'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.4 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\n'
        "ID_LIKE=debian\nHOME_URL=\"https://www.ubuntu.com/\"\nUBUNTU_CODENAME=jammy\n"),
    "debian-12": (
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
        'VERSION_ID="12"\nVERSION="12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n'
        'HOME_URL="https://www.debian.org/"\n'),
    "rocky-9": (
        'NAME="Rocky Linux"\nVERSION="9.3 (Blue Onyx)"\nID="rocky"\n'
        'ID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPLATFORM_ID="platform:el9"\n'
        'PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"\nANSI_COLOR="0;32"\n'
        'CPE_NAME="cpe:/o:rocky:rocky:9::baseos"\n'),
    "al2023": (
        'NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nID_LIKE="fedora"\n'
        'VERSION_ID="2023"\nPLATFORM_ID="platform:al2023"\nPRETTY_NAME="Amazon Linux 2023.3'
        '.20240122"\nANSI_COLOR="0;33"\nCPE_NAME="cpe:2.3:o:amazon:amazon_linux:2023"\n'),
}

COS_LSB_RELEASE = (
    "CHROMEOS_RELEASE_BOARD=lakitu-signed-prempkeys\nCHROMEOS_RELEASE_BRANCH_NUMBER=218\n"
    "CHROMEOS_RELEASE_BUILD_NUMBER=17800\nCHROMEOS_RELEASE_BUILD_TYPE=Official Build\n"
    "CHROMEOS_RELEASE_CHROME_MILESTONE=109\nCHROMEOS_RELEASE_PATCH_NUMBER=20\n"
    "CHROMEOS_RELEASE_TRACK=stable-channel\nCHROMEOS_RELEASE_VERSION=17800.218.20\n"
    "GOOGLE_RELEASE=17800.218.20\n")


@dataclass(frozen=True)
class PciSpec:
    """One PCI function in a fixture: address, vendor, device, class, bound driver."""

    address: str
    device: int
    pci_class: int
    driver: str | None = "nvidia"
    vendor: int = 0x10DE
    numa_node: int = -1


@dataclass(frozen=True)
class IbSpec:
    """One InfiniBand function (a ConnectX port): its ib device name, PCI address and the
    VPD bytes sysfs shows (`switch_vpd` names the NVLink5 switch management port)."""

    name: str
    address: str
    vpd: bytes
    device: int = 0x1021  # ConnectX-7


def vpd_bytes(ident: str, **keywords: str) -> bytes:
    """A PCI VPD image: identifier string, VPD-R keywords with the RV checksum, end tag."""
    ident_data = ident.encode("ascii")
    body = b"".join(key.encode("ascii") + bytes([len(value)]) + value.encode("ascii")
                    for key, value in keywords.items())
    head = bytes([0x82]) + len(ident_data).to_bytes(2, "little") + ident_data
    read_only_len = len(body) + 4
    partial = head + bytes([0x90]) + read_only_len.to_bytes(2, "little") + body + b"RV\x01"
    checksum = (-sum(partial)) & 0xFF  # all bytes up to and including RV sum to zero
    return partial + bytes([checksum, 0x78])


def switch_vpd(serial: str = "MT2412X00001") -> bytes:
    """The VPD of an NVLink5 system's switch management port, as NVIDIA's detection reads
    it (`SW_MNG` in the part's name)."""
    return vpd_bytes("NVIDIA ConnectX-7 SW_MNG", PN="SW_MNG-CX7", EC="A1", SN=serial,
                     V0="PCIeGen5 x4", V2="SW_MNG")


def nic_vpd(serial: str = "MT2410X00042") -> bytes:
    """An ordinary ConnectX-7 NIC's VPD (no switch management)."""
    return vpd_bytes("NVIDIA ConnectX-7 HHHL adapter card, 400GbE / NDR IB", PN="MCX75310AAS",
                     EC="A7", SN=serial, V0="PCIeGen5 x16")


@dataclass(frozen=True)
class NodeSpec:
    """A node fixture: OS, kernel and PCI functions, plus optional security state."""

    os: str
    kernel: str
    arch: str = "x86_64"
    pci: tuple[PciSpec, ...] = ()
    cmdline: str = "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro console=ttyS0"
    sig_enforce: bool = False
    secure_boot: bool | None = None
    lockdown: str | None = "[none] integrity confidentiality"
    extra_files: dict[str, str] = field(default_factory=dict)
    infiniband: tuple[IbSpec, ...] = ()


def _gpu(address: str, device: int, numa: int = 0, driver: str | None = None) -> PciSpec:
    return PciSpec(address, device, 0x030200, driver=driver, numa_node=numa)


def _audio(address: str, driver: str | None = "snd_hda_intel") -> PciSpec:
    return PciSpec(address, 0x10F0, 0x040300, driver=driver)


_HOST_BRIDGE = PciSpec("0000:00:00.0", 0x1237, 0x060000, driver=None, vendor=0x8086)
_VIRTIO_NET = PciSpec("0000:00:03.0", 0x1000, 0x020000, driver="virtio-pci", vendor=0x1AF4)
_A100_BUSES = ("07", "0b", "48", "4c", "88", "8b", "c8", "cb")
_H100_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

SAMPLE_NODES: dict[str, NodeSpec] = {
    "gke-cos-a100x8": NodeSpec(
        os="cos", kernel="6.1.58+",
        pci=(_HOST_BRIDGE, _VIRTIO_NET,
             *(_gpu(f"0000:{bus}:00.0", 0x20B0, numa=i // 4)
               for i, bus in enumerate(_A100_BUSES)),
             *(_audio(f"0000:{bus}:00.1") for bus in _A100_BUSES),
             *(PciSpec(f"0000:c{i}:00.0", 0x1AF1, 0x068000, driver=None, numa_node=1)
               for i in range(1, 7))),
        extra_files={"etc/lsb-release": COS_LSB_RELEASE}),
    "gke-ubuntu-t4": NodeSpec(
        os="ubuntu-22.04", kernel="5.15.0-1049-gke",
        pci=(_HOST_BRIDGE, _VIRTIO_NET, _gpu("0000:00:04.0", 0x1EB8, driver=None))),
    "debian12-l4": NodeSpec(
        os="debian-12", kernel="6.1.0-26-cloud-amd64",
        pci=(_HOST_BRIDGE, _gpu("0000:00:05.0", 0x27B8, driver=None)),
        secure_boot=True),
    "rocky9-h100x8": NodeSpec(
        os="rocky-9", kernel="5.14.0-362.8.1.el9_3.x86_64",
        pci=(_HOST_BRIDGE, *(_gpu(f"0000:{bus}:00.0", 0x2330, numa=i // 4)
                             for i, bus in enumerate(_H100_BUSES)),
             *(PciSpec(f"0000:0{i}:00.0", 0x22A3, 0x068000, driver=None) for i in range(5, 9))),
        sig_enforce=True, lockdown="none [integrity] confidentiality"),
    "al2023-nouveau-vfio": NodeSpec(
        os="al2023", kernel="6.1.61-85.141.amzn2023.x86_64",
        pci=(_gpu("0000:00:1e.0", 0x1EB8, driver="nouveau"),
             _gpu("0000:00:1f.0", 0x1EB8, driver="vfio-pci"))),
    "debian12-future-gpu": NodeSpec(
        os="debian-12", kernel="6.1.0-26-cloud-amd64",
        pci=(_gpu("0000:00:06.0", 0x2F00, driver=None),)),
    "ubuntu-b200x8": NodeSpec(
        os="ubuntu-22.04", kernel="6.8.0-1015-nvidia",
        pci=(_HOST_BRIDGE, *(_gpu(f"0000:{bus}:00.0", 0x2901, numa=i // 4)
                             for i, bus in enumerate(_H100_BUSES))),
        infiniband=(IbSpec("mlx5_0", "0000:1a:00.0", nic_vpd()),
                    IbSpec("mlx5_1", "0000:3c:00.0", switch_vpd()))),
    "debian12-no-gpu": NodeSpec(
        os="debian-12", kernel="6.1.0-26-cloud-amd64", pci=(_HOST_BRIDGE, _VIRTIO_NET)),
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def build_node(root: Path, spec: NodeSpec) -> Path:
    """Write the host tree for `spec` under `root` (host root; proc/ and sys/ inside it)."""
    _write(root / "etc" / "os-release", OS_RELEASES[spec.os])
    for relative, text in spec.extra_files.items():
        _write(root / relative, text)
    _write(root / "proc" / "sys" / "kernel" / "osrelease", spec.kernel + "\n")
    _write(root / "proc" / "sys" / "kernel" / "arch", spec.arch + "\n")
    _write(root / "proc" / "cmdline", spec.cmdline
           + (" module.sig_enforce=1" if spec.sig_enforce else "") + "\n")
    _write(root / "proc" / "modules", "")
    _write(root / "proc" / "devices", "Character devices:\n  1 mem\n  4 tty\n\nBlock devices:\n")
    sys_root = root / "sys"
    _write(sys_root / "module" / "module" / "parameters" / "sig_enforce",
           "Y\n" if spec.sig_enforce else "N\n")
    if spec.lockdown is not None:
        _write(sys_root / "kernel" / "security" / "lockdown", spec.lockdown + "\n")
    if spec.secure_boot is not None:
        efivars = sys_root / "firmware" / "efi" / "efivars"
        efivars.mkdir(parents=True, exist_ok=True)
        name = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
        (efivars / name).write_bytes(b"\x06\x00\x00\x00" + bytes([int(spec.secure_boot)]))
    (root / "dev").mkdir(exist_ok=True)
    for function in spec.pci:
        _write_pci_function(sys_root, function)
    for port in spec.infiniband:
        _write_infiniband(sys_root, port)
    return root


def _write_pci_function(sys_root: Path, spec: PciSpec) -> None:
    """sysfs layout: devices/pci0000:00/<addr>/ with bus/pci/devices/<addr> linking to it."""
    domain_bus = spec.address.rsplit(":", 2)[0]
    device_dir = sys_root / "devices" / f"pci{domain_bus[:4]}:00" / spec.address
    _write(device_dir / "vendor", f"0x{spec.vendor:04x}\n")
    _write(device_dir / "device", f"0x{spec.device:04x}\n")
    _write(device_dir / "class", f"0x{spec.pci_class:06x}\n")
    _write(device_dir / "numa_node", f"{spec.numa_node}\n")
    link = sys_root / "bus" / "pci" / "devices" / spec.address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device_dir, link.parent))
    if spec.driver:
        driver_dir = sys_root / "bus" / "pci" / "drivers" / spec.driver
        driver_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "driver").symlink_to(os.path.relpath(driver_dir, device_dir))


def _write_infiniband(sys_root: Path, spec: IbSpec) -> None:
    """A Mellanox PCI function with its VPD, and class/infiniband/<name> linking to the ib
    device under it, whose `device` links back to the PCI function (sysfs's layout)."""
    _write_pci_function(sys_root, PciSpec(spec.address, spec.device, 0x020700, driver=None,
                                          vendor=0x15B3))
    device_dir = sys_root / "devices" / f"pci{spec.address[:4]}:00" / spec.address
    (device_dir / "vpd").write_bytes(spec.vpd)
    ib_dir = device_dir / "infiniband" / spec.name
    ib_dir.mkdir(parents=True)
    (ib_dir / "device").symlink_to(os.path.relpath(device_dir, ib_dir))
    link = sys_root / "class" / "infiniband" / spec.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(ib_dir, link.parent))


def usage() -> str:
    """What the command does, its nodes, and the root flags a sample node then needs."""
    names = "\n".join(f"  {name}" for name in SAMPLE_NODES)
    return ("usage: python -m installer.testing NODE DIR\n\n"
            "Write a sample node's host tree (os-release, /proc, /sys with its PCI devices) "
            "into DIR, a new or empty directory.\n\nNODE, one of:\n"
            f"{names}\n\nThen point any command at it with all three root flags:\n"
            "  gpu-node-installer detect --host-root DIR --proc-root DIR/proc "
            "--sys-root DIR/sys")


def main(argv: list[str]) -> int:
    """`python -m installer.testing NODE DIR`: write a sample node's host tree."""
    if argv in (["-h"], ["--help"]):
        print(usage())
        return 0
    if len(argv) != 2 or argv[0] not in SAMPLE_NODES:
        print(usage(), file=sys.stderr)
        return 2
    root = Path(argv[1])
    if root.exists() and any(root.iterdir()):
        print(f"{root} exists and is not empty; pick a new directory", file=sys.stderr)
        return 2
    build_node(root, SAMPLE_NODES[argv[0]])
    print(root)
    return 0
