"""Kernel module state as the kernel reports it: /proc/modules, /sys/module, NVRM version.

Also the raw kernel calls (finit_module/delete_module via ctypes) that `RealHost` makes,
module file facts (modinfo, signature) and the errno -> error mapping the load stage uses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import (
    CompressedModuleError,
    InstallerError,
    KernelWithoutModulesError,
    ModuleAlreadyLoadedError,
    ModuleDependencyError,
    ModuleInUseError,
    ModuleLoadError,
    ModulePermissionError,
    NoGpuRespondedError,
    SignatureRejectedError,
    UnsupportedNodeError,
)
from installer.host import Host

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  <date>" (proprietary) or
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build ..."
_NVRM_RE = re.compile(
    r"NVRM version:.*?(?P<open>Open )?Kernel Module.*?\s(?P<version>\d{3,4}\.\d+(?:\.\d+)?)\b")
_STATES = ("Live", "Loading", "Unloading")


class ProcModulesError(UnsupportedNodeError):
    """/proc/modules does not have the kernel's format."""


@dataclass(frozen=True)
class LoadedModule:
    """One line of /proc/modules."""

    name: str
    size: int
    refcount: int
    used_by: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class LoadedDriver:
    """The NVIDIA kernel driver currently loaded, as /proc/driver/nvidia/version says."""

    version: str
    flavour: str | None


def parse_proc_modules(text: str) -> list[LoadedModule]:
    """Parse /proc/modules (`name size refcount deps state address [taint]`)."""
    modules = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if (len(fields) < 5 or not fields[1].isdigit()
                or not fields[2].lstrip("-").isdigit() or fields[4] not in _STATES):
            raise ProcModulesError(
                f"/proc/modules line {number} is malformed: {line[:80]!r}",
                remedy="point --proc-root at the node's real /proc")
        deps = tuple(dep for dep in fields[3].split(",") if dep and dep != "-")
        modules.append(LoadedModule(fields[0], int(fields[1]), int(fields[2]), deps, fields[4]))
    return modules


def loaded_modules(host: Host) -> list[LoadedModule] | None:
    """Modules the kernel has loaded, or None when the kernel has no module support."""
    text = host.read_text(host.roots.proc / "modules")
    return None if text is None else parse_proc_modules(text)


def parse_nvrm_version(text: str) -> LoadedDriver | None:
    """The version and flavour in /proc/driver/nvidia/version, or None when unparseable."""
    match = _NVRM_RE.search(text)
    if match:
        flavour = "open" if match.group("open") else "proprietary"
        return LoadedDriver(match.group("version"), flavour)
    return None


def loaded_driver(host: Host) -> LoadedDriver | None:
    """The loaded NVIDIA driver: the NVRM line first, /sys/module/nvidia/version second."""
    text = host.read_text(host.roots.proc / "driver" / "nvidia" / "version")
    driver = parse_nvrm_version(text) if text else None
    if driver:
        return driver
    version = host.read_text(host.roots.sys / "module" / "nvidia" / "version")
    return LoadedDriver(version.strip(), None) if version and version.strip() else None


# --- loading and unloading (issue 4): syscalls, sysfs state, errno -> error ------------------

# finit_module(2) / delete_module(2) numbers per machine; ctypes needs them (libc has no
# wrapper for finit_module in glibc < 2.38, and the image must not depend on kmod).
SYSCALLS: dict[str, tuple[int, int]] = {"x86_64": (313, 176), "aarch64": (273, 106)}
MODULE_INIT_COMPRESSED_FILE = 4
SIGNATURE_MARKER = b"~Module signature appended~\n"
COMPRESSED_SUFFIXES = (".ko.xz", ".ko.zst", ".ko.gz")


def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in SYSCALLS:
        raise UnsupportedNodeError(f"loading modules on {machine} is not supported",
                                   remedy="run on an x86_64 or aarch64 node")
    return SYSCALLS[machine]


def _syscall(number: int, *args: Any) -> None:
    """Make a raw syscall; raise OSError carrying the kernel's errno when it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def sys_finit_module(fd: int, params: str, flags: int = 0) -> None:
    """finit_module(fd, params, flags): the kernel reads the module from the open file."""
    _syscall(_syscall_numbers()[0], ctypes.c_int(fd), ctypes.c_char_p(params.encode()),
             ctypes.c_int(flags))


def sys_delete_module(name: str) -> None:
    """delete_module(name, O_NONBLOCK): fail at once (EAGAIN) instead of waiting for users."""
    _syscall(_syscall_numbers()[1], ctypes.c_char_p(name.encode()),
             ctypes.c_uint(os.O_NONBLOCK))


def module_name(file_name: str) -> str:
    """`nvidia-uvm.ko.xz` -> `nvidia_uvm`: the kernel's name for a module file."""
    base = file_name.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def normalize(name: str) -> str:
    """Module names compare with '-' and '_' as the same character, like the kernel does."""
    return name.replace("-", "_")


def is_compressed(path: Path) -> bool:
    return path.name.endswith(COMPRESSED_SUFFIXES)


def is_signed(data: bytes) -> bool:
    """A signed module ends with the marker the kernel's signature check looks for."""
    return data.endswith(SIGNATURE_MARKER)


@dataclass(frozen=True)
class ModuleState:
    """What /sys/module/<name> says about a loaded module."""

    name: str
    version: str | None
    refcnt: int
    initstate: str | None
    holders: tuple[str, ...]

    @property
    def users_outside_modules(self) -> int:
        """References not explained by holder modules: open files, other kernel users."""
        return max(0, self.refcnt - len(self.holders))


def module_state(host: Host, name: str) -> ModuleState | None:
    """The module's sysfs state, or None when it is not loaded (built-ins have no refcnt)."""
    base = host.roots.sys / "module" / normalize(name)
    refcnt = host.read_text(base / "refcnt")
    initstate = host.read_text(base / "initstate")
    if refcnt is None and initstate is None:
        return None
    version = host.read_text(base / "version")
    holders = tuple(path.name for path in host.iterdir(base / "holders"))
    count = int(refcnt.strip()) if refcnt and refcnt.strip().lstrip("-").isdigit() else 0
    return ModuleState(normalize(name), version.strip() if version else None, count,
                       initstate.strip() if initstate else None, holders)


def char_majors(host: Host) -> dict[str, int]:
    """Character-device names to majors from /proc/devices (its first section only)."""
    text = host.read_text(host.roots.proc / "devices") or ""
    return parse_char_majors(text)


def parse_char_majors(text: str) -> dict[str, int]:
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        fields = stripped.split()
        if in_char and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def modinfo(data: bytes) -> dict[str, list[str]]:
    """The `.modinfo` section of a module (name, version, depends, vermagic, parm...)."""
    section = _elf_section(data, b".modinfo")
    info: dict[str, list[str]] = {}
    for entry in section.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            info.setdefault(key.decode(errors="replace"), []).append(
                value.decode(errors="replace"))
    return info


def modinfo_depends(data: bytes) -> tuple[str, ...]:
    """Modules the kernel will require loaded first (modpost's depends= line)."""
    try:
        values = modinfo(data).get("depends", [""])
    except ValueError:
        return ()
    return tuple(normalize(d) for d in ",".join(values).split(",") if d)


def _elf_section(data: bytes, wanted: bytes) -> bytes:
    """One section's bytes from an ELF relocatable object (what a .ko file is)."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    head = order + ("QHHH" if is64 else "IHHH")
    shoff, shentsize, shnum, shstrndx = (
        struct.unpack_from(head, data, 0x28 if is64 else 0x20)[0],
        *struct.unpack_from(order + "HHH", data, 0x3A if is64 else 0x2E))
    entry = order + ("IIQQQQ" if is64 else "IIIIII")

    def header(index: int) -> tuple[int, int, int]:
        fields = struct.unpack_from(entry, data, shoff + index * shentsize)
        return fields[0], fields[4], fields[5]  # name offset, file offset, size

    if shoff == 0 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ValueError("ELF section table missing or truncated")
    _, str_off, str_size = header(shstrndx)
    names = data[str_off:str_off + str_size]
    for index in range(shnum):
        name_off, offset, size = header(index)
        if names[name_off:names.find(b"\0", name_off)] == wanted:
            return data[offset:offset + size]
    raise ValueError(f"no {wanted.decode()} section")


def load_failure(exc: OSError, module: str, *, missing: tuple[str, ...] = (),
                 compressed: bool = False) -> InstallerError:
    """Turn a failed finit_module into the specific error and the remedy an operator needs.

    `missing` names the dependencies that are not loaded, so ENOENT can say which one.
    """
    code = exc.errno or 0
    what = f"loading {module}"
    if compressed and code in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOEXEC):
        return CompressedModuleError(
            f"{what}: the kernel cannot decompress modules ({errno.errorcode.get(code)})",
            remedy="provide uncompressed .ko files or a kernel with CONFIG_MODULE_DECOMPRESS")
    if code == errno.EEXIST:
        return ModuleAlreadyLoadedError(f"{what}: already loaded (EEXIST)",
                                        remedy="nothing to do, or unload it first to replace it")
    if code == errno.ENODEV:
        return NoGpuRespondedError(
            f"{what}: no NVIDIA GPU responded to the driver (ENODEV, 'NVRM: No NVIDIA GPU "
            "found')",
            remedy="check the GPU is supported by this driver branch and flavour and not "
                   "bound to nouveau/vfio-pci; see `dmesg | grep NVRM` on the node")
    if code in (errno.EKEYREJECTED, errno.ENOKEY):
        return SignatureRejectedError(
            f"{what}: the kernel rejected the module signature ({errno.errorcode[code]}, "
            f"errno {code}): signatures are enforced (secure boot, lockdown or sig_enforce)")
    if code == errno.ENOENT:
        needed = ", ".join(missing) if missing else "unknown (see dmesg: 'Unknown symbol')"
        return ModuleDependencyError(
            f"{what}: a module it depends on is not loaded: {needed} (ENOENT)",
            remedy="load the named module first or ship it in the package's module list")
    if code in (errno.EBUSY, errno.EAGAIN):
        return ModuleInUseError(f"{what}: the module is busy ({errno.errorcode[code]})")
    if code == errno.EPERM:
        return ModulePermissionError(
            f"{what}: not permitted (EPERM)",
            remedy="run privileged with CAP_SYS_MODULE; check kernel lockdown "
                   "(/sys/kernel/security/lockdown) and modules_disabled")
    if code == errno.ENOSYS:
        return KernelWithoutModulesError(
            f"{what}: this kernel cannot load modules (ENOSYS)",
            remedy="use a kernel built with CONFIG_MODULES (GPU nodes need loadable modules)")
    if code == errno.ENOEXEC:
        return ModuleLoadError(
            f"{what}: invalid module format (ENOEXEC): built for another kernel?",
            remedy="use a package built for this node's exact kernel release")
    name = errno.errorcode.get(code, "errno")
    return ModuleLoadError(f"{what}: {exc.strerror or 'failed'} ({name} {code})")


def unload_failure(exc: OSError, module: str) -> InstallerError:
    """Turn a failed delete_module into a specific error."""
    code = exc.errno or 0
    if code in (errno.EAGAIN, errno.EBUSY):
        return ModuleInUseError(f"unloading {module}: still in use "
                                f"({errno.errorcode[code]})")
    if code == errno.EPERM:
        return ModulePermissionError(f"unloading {module}: not permitted (EPERM)",
                                     remedy="run privileged with CAP_SYS_MODULE")
    if code == errno.ENOSYS:
        return KernelWithoutModulesError(f"unloading {module}: no module support (ENOSYS)",
                                         remedy="nothing to unload on this kernel")
    name = errno.errorcode.get(code, "errno")
    return ModuleLoadError(f"unloading {module}: {exc.strerror or 'failed'} ({name} {code})",
                           remedy="read the kernel log (dmesg) on the node")
