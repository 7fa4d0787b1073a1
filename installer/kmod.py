"""Kernel module state as the kernel reports it: /proc/modules, /sys/module, NVRM version.

Read side only here; loading and unloading live behind the host seam (see installer.host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from installer.errors import UnsupportedNodeError
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
