"""Kernel module state as the kernel reports it: /proc/modules, /sys/module, NVRM version.

Also module file facts (modinfo, signature, names). The raw syscalls are in
`installer.node.syscalls`; the errno -> error mapping is the load stage's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from installer.errors import UnsupportedNodeError
from installer.node import elf
from installer.node.host import Host

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


SIGNATURE_MARKER = b"~Module signature appended~\n"
COMPRESSED_SUFFIXES = (".ko.xz", ".ko.zst", ".ko.gz")


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


# NVIDIA's IMEX guide ("IMEX Channels"): the driver registers this char device and makes no
# node; channel N is minor N under /dev/nvidia-caps-imex-channels/.
IMEX_CHANNELS = "nvidia-caps-imex-channels"


def char_majors(host: Host) -> dict[str, int]:
    """Character-device names to majors from /proc/devices (its first section only)."""
    text = host.read_text(host.roots.proc / "devices") or ""
    return parse_char_majors(text)


def mig_minors(host: Host) -> dict[str, int]:
    """The driver's MIG capability table, /proc/driver/nvidia-caps/mig-minors:
    `gpu0/gi1/access` (and `gpu0/gi1/ci0/access`, `config`, `monitor`) -> its minor."""
    table: dict[str, int] = {}
    for line in (host.read_text(host.roots.proc / "driver/nvidia-caps/mig-minors") or ""
                 ).splitlines():
        key, _, number = line.strip().rpartition(" ")
        if key and number.isdigit():
            table[key] = int(number)
    return table


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
    section = elf.section(data, b".modinfo")
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
