"""The CDI spec file on the node: written atomically, only ever over our own, and removed.

The spec lives in the runtimes' directory (`CDI_SPEC_DIR`: `/var/run/cdi`, or `/etc/cdi`
to survive a reboot) as `gpu-node-installer-nvidia.json`, a name that marks it ours. That
directory is shared with other writers (NVIDIA's toolkit writes `nvidia.yaml` there), so
the name alone proves nothing: the install dir keeps a record (`.cdi.json`: the path and
the sha256 of each spec we wrote), as `.devnodes.json` does for device nodes. A file at our
path whose bytes we did not write is someone else's and is never replaced or removed.

The record is written before the spec with both the old and the new digest, and after it
with the new one only: a crash between the two leaves a spec we still recognise.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from installer.config import Config
from installer.installdir import cdi, cdihook, cdimig
from installer.installdir.layout import CDI_RECORD
from installer.installdir.ownership import guard_cdi
from installer.installdir.versions import current_name
from installer.node.documents import DocumentError, read_json_file
from installer.node.host import Host, Roots, write_atomic

SPEC_FILE = "gpu-node-installer-nvidia.json"
_MAX_RECORD_BYTES = 64 * 1024
_KIND_RE = re.compile(r"""["']?kind["']?\s*:\s*["']?nvidia\.com/gpu["']?\s*[,}\n]""")


@dataclass(frozen=True)
class Published:
    """What happened to the spec file in this run."""

    path: str | None  # the spec as a node path, when one of ours is there now
    version: str | None  # the staged version it points at
    action: str  # written | unchanged | removed | off | refused
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "version": self.version, "action": self.action,
                "warnings": list(self.warnings)}


def spec_node_path(config: Config) -> PurePosixPath:
    return config.cdi_spec_dir / SPEC_FILE


def publish(config: Config, roots: Roots, spec: cdi.Spec | None, version: str | None,
            gpus: Sequence[cdi.CdiGpu] = ()) -> Published:
    """Write `spec` at our path (or remove ours when `spec` is None or CDI=off); retire a
    spec of ours left in another directory by an earlier CDI_SPEC_DIR. The record keeps
    `gpus`, so a rollback can rewrite the spec without asking NVML again."""
    guard_cdi(config, roots)  # a spec dir that is a file: one clear line, nothing written
    install = roots.node(config.install_dir)
    record = read_record(install)
    target = spec_node_path(config)
    if record.get("path") not in (None, str(target)):
        _remove_owned(roots, PurePosixPath(str(record["path"])), record)
        record = {}
        _write_record(install, record)
    if spec is None or config.cdi != "on":
        removed = _remove_owned(roots, target, record)
        (install / CDI_RECORD).unlink(missing_ok=True)
        cdihook.remove(install)
        return Published(None, None, "off" if config.cdi != "on" else "removed"
                         if removed else "unchanged")
    path = roots.node_entry(target)
    data = cdi.render(spec).encode()
    current = cdi.read_spec_file(path)
    if (current is not None or path.is_symlink() or path.exists()) and not _owned(
            current, record):
        return Published(None, None, "refused", (
            f"{target} exists and was not written by gpu-node-installer: left untouched, "
            "no CDI spec written; remove it (or set CDI_SPEC_DIR) to have ours",))
    new = _digest(data)
    base = {"path": str(target), "version": version, "gpus": [asdict(g) for g in gpus]}
    if current == data:
        cdihook.ensure(install)
        _write_record(install, {**base, "sha256": [new]})
        return Published(str(target), version, "unchanged", _conflicts(roots, config))
    known = [d for d in record.get("sha256", []) if isinstance(d, str)][-1:]
    _write_record(install, {**base, "sha256": [*known, new]})
    cdihook.ensure(install)  # before the spec that names it
    write_atomic(path, data)
    _write_record(install, {**base, "sha256": [new]})
    return Published(str(target), version, "written", _conflicts(roots, config))


def refresh(config: Config, host: Host) -> Published | None:
    """After a rollback: point our spec (if there is one) at the version now in service,
    for the GPUs it named. None when there is no spec of ours to follow."""
    install = host.roots.node(config.install_dir)
    record = read_record(install)
    if not isinstance(record.get("path"), str):
        return None
    version = current_name(install)
    gpus = cdi.gpus_from(record.get("gpus"))
    spec = None if version is None else cdimig.node_spec(host, config.install_dir, version,
                                                         gpus)
    return publish(config, host.roots, spec, version, gpus)


def withdraw(config: Config, roots: Roots) -> list[str]:
    """Remove our spec wherever the record says it is (uninstall); a foreign one stays."""
    install = roots.node(config.install_dir)
    record = read_record(install)
    removed = []
    if isinstance(record.get("path"), str) and _remove_owned(
            roots, PurePosixPath(record["path"]), record):
        removed.append(record["path"])
    (install / CDI_RECORD).unlink(missing_ok=True)
    cdihook.remove(install)
    return removed


def describe(config: Config, roots: Roots) -> dict[str, Any]:
    """For `status`: where our spec is, which version it points at, and whether its bytes
    are still the ones we wrote."""
    record = read_record(roots.node(config.install_dir))
    path = record.get("path")
    if not isinstance(path, str):
        return {"enabled": config.cdi == "on", "path": None, "version": None, "intact": False}
    current = cdi.read_spec_file(roots.node_entry(path))
    return {"enabled": config.cdi == "on", "path": path, "version": record.get("version"),
            "intact": _owned(current, record)}


def read_record(install: Path) -> dict[str, Any]:
    """`.cdi.json`, or {} when absent or malformed (then nothing counts as ours)."""
    path = install / CDI_RECORD
    try:
        if path.is_symlink():
            return {}
        data = read_json_file(path, limit=_MAX_RECORD_BYTES)
    except (OSError, DocumentError):
        return {}
    if not isinstance(data, dict) or not _our_name(data.get("path")):
        return {}
    return data


def _our_name(path: object) -> bool:
    """A record names only a file called SPEC_FILE, by an absolute path without '..': a
    doctored record cannot make us replace or delete anything else on the node."""
    if not isinstance(path, str):
        return False
    node = PurePosixPath(path)
    return node.is_absolute() and ".." not in node.parts and node.name == SPEC_FILE


def _write_record(install: Path, record: dict[str, Any]) -> None:
    write_atomic(install / CDI_RECORD, (json.dumps(record, indent=1) + "\n").encode())


def _owned(current: bytes | None, record: dict[str, Any]) -> bool:
    digests = record.get("sha256")
    return current is not None and isinstance(digests, list) and _digest(current) in digests


def _remove_owned(roots: Roots, node_path: PurePosixPath, record: dict[str, Any]) -> bool:
    path = roots.node_entry(node_path)
    if not _owned(cdi.read_spec_file(path), record):
        return False
    path.unlink()
    return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _conflicts(roots: Roots, config: Config) -> tuple[str, ...]:
    """Other specs of kind nvidia.com/gpu in the same directory: runtimes refuse devices
    two specs of one directory both define."""
    directory = roots.node(config.cdi_spec_dir)
    found = []
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        if entry.name == SPEC_FILE or entry.suffix not in (".json", ".yaml", ".yml"):
            continue
        text = (cdi.read_spec_file(entry) or b"").decode("utf-8", "replace")
        if _KIND_RE.search(text):
            found.append(f"{config.cdi_spec_dir / entry.name} also defines kind {cdi.KIND}: "
                         "runtimes report its devices as conflicting with ours; remove one "
                         "(or set CDI=off)")
    return tuple(found)
