"""The driver's daemons staged in the install dir, and what a node's fabric needs of them.

The stage records each daemon of the package (`manifest.daemons`) in the version's
`.staged.json` with the staged paths of its files and its binary's sha256 (the manifest's:
the agent hashes the binary against it before each start); `staged_daemons` reads that record
through `.current`, so the paths follow the version in service (an upgrade's one rename
switches the daemons with the libraries). `require_daemons` refuses (exit 14) a node whose
NVSwitch or NVLink5 fabric needs Fabric Manager (and NVLSM) when the package lacks them or
carries a Fabric Manager of another version than the driver: NVIDIA requires them equal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeGuard

from installer.config import Config
from installer.errors import IncompatibleError
from installer.installdir.layout import AGENT_DIR, CURRENT, KIND_DIRS, STAGED_META, install_root
from installer.node.host import Roots
from installer.packages.daemons import (
    DAEMON_NAMES,
    FABRIC_MANAGER,
    NVLSM,
    VERSION_RE,
    DaemonEntry,
)
from installer.packages.documents import DocumentError, read_document, read_file
from installer.packages.placement import Placed, destination

SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")
MAX_META_BYTES = 64 * 1024  # as installer.installdir.versions reads .staged.json
# what each fabric kind (installer.node.fabric.FabricKind) needs running
NEEDED: dict[str, tuple[str, ...]] = {"none": (), "nvswitch": (FABRIC_MANAGER,),
                                      "nvlink5": (FABRIC_MANAGER, NVLSM)}
_WHAT = {"nvswitch": "an NVSwitch fabric", "nvlink5": "an NVLink5 fabric"}
_FLAGS = {FABRIC_MANAGER: "--fabricmanager fabricmanager-linux-<arch>-{driver}-archive.tar.xz",
          NVLSM: "--nvlsm nvlsm-linux-<arch>-<version>-archive.tar.xz"}


@dataclass(frozen=True)
class StagedDaemon:
    """A daemon of the package in service: paths as seen here, under `<install>/.current`.

    `files` are all its staged files (Fabric Manager's topology files sit beside its config);
    `sha256` the binary's, as the package's manifest says (None in a record from before it).
    """

    name: str
    version: str
    binary: Path
    config: Path | None
    files: tuple[Path, ...] = ()
    sha256: str | None = None


def records_dir(config: Config, roots: Roots) -> Path:
    """Where the agent records each daemon it starts (installer.node.daemons): its work
    area, which the upgrade flow reads too before it stops them."""
    return install_root(config, roots) / AGENT_DIR / "daemons"


def staged_record(files: Iterable[Placed], daemons: Iterable[DaemonEntry]
                  ) -> dict[str, dict[str, Any]]:
    """What the stage writes under `daemons` in `.staged.json`: staged paths per daemon."""
    by_path = {entry.path: entry for entry in files}

    def staged(relpath: str | None) -> str | None:
        return None if relpath is None else str(destination(by_path[relpath]))

    return {d.name: {"version": d.version, "binary": staged(d.binary),
                     "sha256": getattr(by_path[d.binary], "sha256", None),
                     "config": staged(d.config),
                     "files": sorted(str(destination(by_path[p])) for p in d.files)}
            for d in daemons}


class ManifestWithDaemons(Protocol):
    """The parts of installer.packages.manifest.Manifest that say what daemons it brings."""

    @property
    def files(self) -> tuple[Placed, ...]: ...
    @property
    def daemons(self) -> tuple[DaemonEntry, ...]: ...


def package_daemons(config: Config, roots: Roots, manifest: ManifestWithDaemons
                    ) -> dict[str, StagedDaemon]:
    """The daemons a package will have in service once staged (paths under `.current`):
    what `install` checks with `require_daemons` before anything is unloaded."""
    current = install_root(config, roots) / CURRENT
    record = staged_record(manifest.files, manifest.daemons)
    found = {name: _from_record(current, name, entry) for name, entry in record.items()}
    return {name: daemon for name, daemon in sorted(found.items()) if daemon is not None}


def staged_daemons(config: Config, roots: Roots) -> dict[str, StagedDaemon]:
    """The daemons of the version in service; empty when none, or nothing is staged.

    A record that is malformed (not written by this installer) counts as no daemons: the
    agent then refuses a fabric node with the remedy instead of running a stray path.
    """
    current = install_root(config, roots) / CURRENT
    try:
        data = read_file(current / STAGED_META, MAX_META_BYTES)
        meta = None if data is None else read_document(
            data, name=STAGED_META, source=str(current), limit=MAX_META_BYTES)
    except (DocumentError, OSError):
        return {}
    record = meta.get("daemons") if isinstance(meta, dict) else None
    if not isinstance(record, dict):
        return {}
    found = {}
    for name, entry in sorted(record.items()):
        daemon = _from_record(current, name, entry)
        if daemon is not None:
            found[name] = daemon
    return found


def _from_record(current: Path, name: str, entry: Any) -> StagedDaemon | None:
    if name not in DAEMON_NAMES or not isinstance(entry, dict):
        return None
    version, binary, config = entry.get("version"), entry.get("binary"), entry.get("config")
    files, sha256 = entry.get("files"), entry.get("sha256")
    if (not isinstance(version, str) or not VERSION_RE.match(version)
            or not _staged_path(binary) or not (config is None or _staged_path(config))
            or not isinstance(files, list) or not all(_staged_path(f) for f in files)
            or not (sha256 is None or (isinstance(sha256, str) and SHA256_RE.match(sha256)))):
        return None
    return StagedDaemon(name, version, current / binary,
                        None if config is None else current / config,
                        tuple(current / f for f in files), sha256)


def _staged_path(value: Any) -> TypeGuard[str]:
    """A relative path below one of the version directory's kind dirs, nothing else."""
    if not isinstance(value, str):
        return False
    path = PurePosixPath(value)
    return (not path.is_absolute() and len(path.parts) >= 2
            and path.parts[0] in KIND_DIRS.values()
            and not any(part in ("", ".", "..") for part in value.split("/")))


def require_daemons(kind: str, staged: dict[str, StagedDaemon], driver_version: str) -> None:
    """Refuse (exit 14) a fabric the package cannot serve: a daemon missing, or a Fabric
    Manager whose version is not exactly the driver's."""
    if kind not in NEEDED:
        raise ValueError(f"unknown fabric kind {kind!r}; known: {', '.join(NEEDED)}")
    needed = NEEDED[kind]
    missing = [name for name in needed if name not in staged]
    if missing:
        flags = " ".join(_FLAGS[name] for name in missing).format(driver=driver_version)
        raise IncompatibleError(
            f"this node has {_WHAT[kind]} and needs {' and '.join(missing)}, but the driver "
            f"package {driver_version} carries no {' or '.join(missing)}",
            remedy=f"rebuild the package with `package build ... {flags}` and publish it, "
                   "or set FABRIC_MANAGER=host if the node itself runs Fabric Manager")
    fabric_manager = staged.get(FABRIC_MANAGER)
    if needed and fabric_manager is not None and fabric_manager.version != driver_version:
        raise IncompatibleError(
            f"Fabric Manager {fabric_manager.version} in the package differs from the "
            f"driver {driver_version}; NVIDIA requires the same version",
            remedy=f"rebuild the package with `package build ... "
                   f"{_FLAGS[FABRIC_MANAGER].format(driver=driver_version)}`")
