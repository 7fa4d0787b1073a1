"""The manifest's optional `daemons`: the driver's daemons a package carries, with versions.

Fabric Manager (`nv-fabricmanager`), the NVLink Subnet Manager (`nvlsm`), the persistence
daemon (`nvidia-persistenced`) and GB200/GB300's IMEX service (`nvidia-imex`) are ordinary
files of the package (binaries, libraries, configs, hashed and verified like every file);
`daemons` only says which files make up which daemon and what version each is, so the agent
can start them and refuse a Fabric Manager or IMEX whose version differs from the driver's.
Manifests without it keep their digest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol

FABRIC_MANAGER = "nv-fabricmanager"
NVLSM = "nvlsm"
PERSISTENCED = "nvidia-persistenced"
IMEX = "nvidia-imex"
DAEMON_NAMES = (FABRIC_MANAGER, NVLSM, PERSISTENCED, IMEX)
# NVIDIA requires these at exactly the driver's version (IMEX checks the loaded driver)
DRIVER_VERSIONED = (FABRIC_MANAGER, IMEX)
# the config file each daemon is started with (`nv-fabricmanager -c`, `nvlsm -F`,
# `nvidia-imex -c`: NVIDIA's /etc/nvidia-imex/config.cfg, renamed so it cannot collide)
CONFIG_NAMES = {FABRIC_MANAGER: "fabricmanager.cfg", NVLSM: "nvlsm.conf",
                IMEX: "nvidia-imex.cfg"}
# upstream versions: 550.54.15 (driver-versioned), 2025.06.6 (NVLSM's own)
VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+~-]{0,63}\Z")
_KEYS = {"version", "files"}
_FILE_KEYS = {"path", "sha256"}


class Filed(Protocol):
    """A manifest file entry (installer.packages.manifest.FileEntry)."""

    @property
    def path(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class DaemonEntry:
    """One daemon of the package: its name, version and the package paths of its files."""

    name: str
    version: str
    files: tuple[str, ...]

    @property
    def binary(self) -> str:
        """The package path of the executable (`bin/<name>`)."""
        return next(p for p in self.files if PurePosixPath(p).name == self.name)

    @property
    def config(self) -> str | None:
        """The package path of the config file it is started with, when it has one."""
        wanted = CONFIG_NAMES.get(self.name)
        return next((p for p in self.files if PurePosixPath(p).name == wanted), None)


def parse_daemons(value: Any, files: Iterable[Filed],
                  fail: Callable[[str, str], Exception]) -> tuple[DaemonEntry, ...]:
    """Validate `daemons`: known names, versions, files of the package listed once."""
    if not isinstance(value, dict):
        raise fail("daemons", "must be an object of daemon name to {version, files}")
    by_path = {entry.path: entry for entry in files}
    seen: set[str] = set()
    entries = []
    for name in sorted(value):
        where = f"daemons.{str(name)[:40]}"
        if name not in DAEMON_NAMES:
            raise fail(where, f"unknown daemon; known: {', '.join(DAEMON_NAMES)}")
        obj = value[name]
        if not isinstance(obj, dict) or set(obj) != _KEYS:
            raise fail(where, "must be an object with exactly version, files")
        version = obj["version"]
        if not isinstance(version, str) or not VERSION_RE.match(version):
            raise fail(f"{where}.version", f"{str(version)[:80]!r} must be a version like "
                       "550.54.15")
        paths = _parse_files(obj["files"], by_path, seen, f"{where}.files", fail)
        binary = [p for p in paths if PurePosixPath(p).name == name]
        if len(binary) != 1 or by_path[binary[0]].kind != "binary":
            raise fail(f"{where}.files", f"must hold the executable {name} (kind binary)")
        entries.append(DaemonEntry(name, version, paths))
    return tuple(entries)


def _parse_files(value: Any, by_path: dict[str, Filed], seen: set[str], where: str,
                 fail: Callable[[str, str], Exception]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise fail(where, "must be a non-empty list of {path, sha256}")
    paths = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != _FILE_KEYS:
            raise fail(f"{where}[{i}]", "must be an object with exactly path, sha256")
        path = item["path"]
        entry = by_path.get(path) if isinstance(path, str) else None
        if entry is None or path in seen:
            raise fail(f"{where}[{i}].path", f"{str(path)[:80]!r} is not a file of the "
                       "package, or is listed twice")
        if item["sha256"] != entry.sha256:
            raise fail(f"{where}[{i}].sha256", f"differs from the sha256 of {path} in files")
        seen.add(path)
        paths.append(path)
    return tuple(paths)


def daemons_to_dict(entries: Iterable[DaemonEntry], files: Iterable[Filed]
                    ) -> dict[str, dict[str, Any]]:
    """The JSON shape of `daemons` (sorted, each file with its sha256 from `files`)."""
    sha = {entry.path: entry.sha256 for entry in files}
    return {e.name: {"version": e.version,
                     "files": [{"path": p, "sha256": sha[p]} for p in sorted(e.files)]}
            for e in sorted(entries, key=lambda e: e.name)}
