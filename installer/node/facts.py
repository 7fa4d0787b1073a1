"""What this node is, read through the host seam: OS, kernel, NVIDIA PCI functions,
the loaded driver, the RDMA stack and whether the kernel insists on signed modules.

Read only. The detect stage reports it; fetch, load, verify and status read the same facts.
`node_text` is their human-readable form for the debugging commands (`detect`, `status`).
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from installer.node import arches, kmod, pci
from installer.node import fabric as _fabric
from installer.node import rdma as _rdma
from installer.node.host import Host
from installer.node.osinfo import OsInfo, read_os_info

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@dataclass(frozen=True)
class Security:
    """Whether the kernel will insist on signed modules; None means the node does not say."""

    secure_boot: bool | None
    module_sig_enforce: bool
    lockdown: str | None

    @property
    def requires_signed_modules(self) -> bool:
        return bool(self.secure_boot) or self.module_sig_enforce or self.lockdown not in (
            None, "none")


@dataclass(frozen=True)
class NodeInfo:
    """The detect stage's result."""

    os: OsInfo
    kernel_release: str
    kernel_arch: str
    functions: tuple[pci.PciFunction, ...]
    loaded_driver: kmod.LoadedDriver | None
    security: Security
    notes: tuple[str, ...] = field(default=())
    fabric: _fabric.FabricFacts = field(default=_fabric.FabricFacts("none"))
    rdma: _rdma.RdmaStack | None = None

    @property
    def gpus(self) -> list[pci.PciFunction]:
        return [f for f in self.functions if f.kind == pci.KIND_GPU]

    @property
    def nvswitches(self) -> list[pci.PciFunction]:
        return [f for f in self.functions if f.kind == pci.KIND_NVSWITCH]

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape documented in docs/reference.md (keys are a contract)."""
        return {
            "os": {**asdict(self.os), "family": self.os.family},
            "kernel": {"release": self.kernel_release, "arch": self.kernel_arch},
            "gpus": [asdict(f) for f in self.gpus],
            "nvswitches": [asdict(f) for f in self.nvswitches],
            "other_functions": [asdict(f) for f in self.functions
                                if f.kind not in (pci.KIND_GPU, pci.KIND_NVSWITCH)],
            "loaded_driver": {"version": self.loaded_driver.version if self.loaded_driver
                              else None,
                              "flavour": self.loaded_driver.flavour if self.loaded_driver
                              else None},
            "security": {**asdict(self.security),
                         "requires_signed_modules": self.security.requires_signed_modules},
            "notes": list(self.notes),
            "fabric": self.fabric.to_dict(),
            "rdma": self.rdma.to_dict() if self.rdma else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        """What `detect` prints and `status` starts with (`node_text`)."""
        return node_text(self)

    def log_fields(self) -> dict[str, Any]:
        return {"os": self.os.id, "kernel": self.kernel_release, "gpus": len(self.gpus),
                "nvswitches": len(self.nvswitches), "fabric": self.fabric.kind,
                "loaded_driver": self.loaded_driver.version if self.loaded_driver else None}


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def node_text(node: NodeInfo) -> str:
    """A few aligned lines an operator can read at 3 a.m."""
    os_line = node.os.pretty_name or node.os.id
    if node.os.cos_milestone:
        os_line += f" (COS milestone {node.os.cos_milestone}, build {node.os.cos_build})"
    driver = node.loaded_driver
    lines = [
        f"OS:              {os_line}",
        f"Kernel:          {node.kernel_release} ({node.kernel_arch})",
        f"Loaded driver:   {driver.version + ' ' + (driver.flavour or '') if driver else 'none'}",
        f"Secure boot:     {_yes_no(node.security.secure_boot)}; "
        f"sig_enforce: {_yes_no(node.security.module_sig_enforce)}; "
        f"lockdown: {node.security.lockdown or 'unknown'}",
        f"GPUs:            {len(node.gpus)}",
    ]
    for gpu in node.gpus:
        numa = "-" if gpu.numa_node is None else str(gpu.numa_node)
        lines.append(f"  {gpu.pci_address}  {gpu.device_id}  {gpu.name:<22} {gpu.architecture:<13}"
                     f" driver={gpu.driver:<9} numa={numa} flavours={'/'.join(gpu.flavours)}")
    if node.nvswitches:
        lines.append(f"NVSwitches:      {len(node.nvswitches)}")
    lines.append(f"Fabric:          {node.fabric.text}")
    if node.rdma is not None:
        lines.append(f"RDMA:            {node.rdma.text}")
    if not node.gpus:
        lines.append("  no NVIDIA GPU on this node")
    lines.extend(f"Note: {note}" for note in node.notes)
    return "\n".join(lines)


def detect_node(host: Host) -> NodeInfo:
    """Read everything detect reports from the host seam."""
    functions = tuple(pci.scan(host))
    fabric = _fabric.read_fabric_facts(host, nvswitch_functions=len(
        [f for f in functions if f.kind == pci.KIND_NVSWITCH]))
    return NodeInfo(
        os=read_os_info(host),
        kernel_release=_kernel_release(host),
        kernel_arch=_kernel_arch(host),
        functions=functions,
        loaded_driver=kmod.loaded_driver(host),
        security=read_security(host),
        notes=tuple(_binding_notes(functions)) + tuple(_fabric_notes(fabric)),
        fabric=fabric,
        rdma=_rdma.read_stack(host),
    )


def _kernel_release(host: Host) -> str:
    text = host.read_text(host.roots.proc / "sys" / "kernel" / "osrelease")
    return text.strip() if text and text.strip() else platform.release()


def _kernel_arch(host: Host) -> str:
    """`uname -m` as the node's kernel says it (the host's /proc, not the container's
    Python); `arm64`/`amd64` spellings become the kernel's names, an unknown arch stays."""
    text = host.read_text(host.roots.proc / "sys" / "kernel" / "arch")
    name = text.strip() if text and text.strip() else platform.machine()
    return arches.canonical(name) or name


def read_security(host: Host) -> Security:
    """Secure boot (efivars), module.sig_enforce (param or cmdline) and the lockdown mode."""
    sys_root, proc_root = host.roots.sys, host.roots.proc
    efivar = host.read_bytes(sys_root / "firmware" / "efi" / "efivars" / SECURE_BOOT_VAR, 64)
    secure_boot = None if efivar is None or len(efivar) < 5 else efivar[4] == 1
    param = (host.read_text(sys_root / "module" / "module" / "parameters" / "sig_enforce")
             or "").strip()
    cmdline = (host.read_text(proc_root / "cmdline") or "").split()
    enforce = param == "Y" or "module.sig_enforce=1" in cmdline
    if secure_boot is None and host.read_text(sys_root / "firmware" / "efi" / "systab"):
        secure_boot = False
    return Security(secure_boot, enforce, _lockdown(host.read_text(
        sys_root / "kernel" / "security" / "lockdown")))


def _lockdown(text: str | None) -> str | None:
    """The bracketed mode of `[none] integrity confidentiality`."""
    if not text:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _binding_notes(functions: tuple[pci.PciFunction, ...]) -> list[str]:
    """Warn about GPUs another driver owns: the NVIDIA module cannot drive them."""
    notes = []
    for function in functions:
        if function.kind != pci.KIND_GPU:
            continue
        if function.driver == "nouveau":
            notes.append(f"GPU {function.pci_address} is bound to nouveau: blacklist nouveau "
                         "(modprobe.blacklist=nouveau) and reboot")
        elif function.driver == "vfio-pci":
            notes.append(f"GPU {function.pci_address} is bound to vfio-pci (passed through to "
                         "a VM): it will not be usable by containers on this node")
    return notes


def _fabric_notes(fabric: _fabric.FabricFacts) -> list[str]:
    """An InfiniBand VPD we could not read may hide an NVLink5 node: say so."""
    if not fabric.unreadable_vpd or fabric.kind == "nvlink5":
        return []
    return [f"cannot read the VPD of InfiniBand device(s) {', '.join(fabric.unreadable_vpd)}: "
            "an NVLink5 node (needs Fabric Manager) may go unrecognised; run privileged"]
