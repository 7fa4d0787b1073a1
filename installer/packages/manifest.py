"""Driver packages: the manifest model, strict validation, verified reading of package trees.

A package is a directory (or a tarball of one) with `manifest.json` at its root; see
docs/package-format.md. Nothing here trusts its input: every path, size, hash, mode and
kind is checked before a byte of the package is used, and files are hashed while read.
Tarballs are unpacked by `installer.packages.tar`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.errors import IntegrityError
from installer.node.arches import ARCHES as ARCHES
from installer.packages.daemons import DaemonEntry, daemons_to_dict, parse_daemons
from installer.packages.documents import read_document
from installer.packages.ima import ImaEntry, ima_to_list, parse_ima
from installer.packages.modules import ModuleEntry as ModuleEntry
from installer.packages.modules import parse_modules
from installer.packages.placement import staged_clash
from installer.packages.provenance import provenance_of
from installer.packages.signatures import SignatureEntry, parse_signatures, signatures_to_list

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
KINDS = ("module", "library", "binary", "firmware", "config", "source")
FLAVOURS = ("open", "proprietary")
MAX_FILE_SIZE = 8 * 1024**3
MAX_TOTAL_SIZE = 32 * 1024**3
MAX_FILES = 20_000
MAX_MANIFEST_BYTES = 8 * 1024**2
MAX_PATH_CHARS = 1024
NAME_MAX = 255  # bytes in one path component (Linux): a longer one cannot be created
HASH_CHUNK = 1024 * 1024
DRIVER_VERSION_RE = re.compile(r"^\d{3,4}\.\d{1,3}(\.\d{1,3})?$")
KERNEL_RELEASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$")
SOURCE_RELEASE = "source"  # the kernel_release of a source package (built for no kernel)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_OS_KEYS = ("id", "version_id", "build_id")
_TOP_KEYS = {"schema_version", "driver_version", "kernel_release", "arch", "flavour", "os",
             "files", "modules"}
_OPTIONAL_TOP_KEYS = frozenset({"links", "signatures", "provenance", "ima", "daemons",
                                "optional_modules"})
_FILE_KEYS = {"path", "size", "sha256", "mode", "kind"}
_LINK_KEYS = {"path", "target"}


class ManifestError(IntegrityError):
    """A manifest (or the package around it) breaks the package format."""

    default_remedy = "rebuild the package with `gpu-node-installer package build` and republish it"


class PackageFileError(IntegrityError):
    """A file of the package is missing or differs from its manifest entry."""


def package_path(kernel_release: str, driver_version: str, flavour: str,
                 arch: str = "x86_64") -> str:
    """Where a package lives in a repository: `<kernel>/<version>/<flavour>` for x86_64 (and
    an arch not yet known), `<flavour>-<arch>` otherwise, so two arches sharing a kernel
    release (COS, Ubuntu) never share a path."""
    suffix = f"-{arch}" if arch not in ("", ARCHES[0]) else ""
    return f"{kernel_release}/{driver_version}/{flavour}{suffix}"


@dataclass(frozen=True)
class FileEntry:
    """One file of a package: relative path, size, sha256, permission bits and kind."""

    path: str
    size: int
    sha256: str
    mode: int
    kind: str


@dataclass(frozen=True)
class LinkEntry:
    """A relative symbolic link the stage recreates (e.g. `lib64/libcuda.so.1`)."""

    path: str
    target: str


@dataclass(frozen=True)
class Manifest:
    """What `manifest.json` says: identity, every file, the modules in load order."""

    schema_version: int
    driver_version: str
    kernel_release: str
    arch: str
    flavour: str
    os: dict[str, str] | None
    files: tuple[FileEntry, ...]
    modules: tuple[ModuleEntry, ...]
    links: tuple[LinkEntry, ...] = ()
    signatures: tuple[SignatureEntry, ...] = ()  # who signed which module (optional)
    provenance: dict[str, Any] | None = None  # what compiled modules were made from
    ima: tuple[ImaEntry, ...] = ()  # firmware staged with a security.ima signature
    daemons: tuple[DaemonEntry, ...] = ()  # Fabric Manager, NVLSM, persistenced (optional)
    # loaded after `modules`, each failing alone (gdrdrv, nvidia-fs: load/optional.py)
    optional_modules: tuple[ModuleEntry, ...] = ()

    def daemon(self, name: str) -> DaemonEntry | None:
        """The daemon of that name the package carries, or None."""
        return next((d for d in self.daemons if d.name == name), None)

    def file(self, relpath: str) -> FileEntry:
        """The entry for a path, or KeyError."""
        for entry in self.files:
            if entry.path == relpath:
                return entry
        raise KeyError(relpath)

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.files)

    @property
    def key(self) -> str:
        """Where the package lives in a repository (`package_path`)."""
        return package_path(self.kernel_release, self.driver_version, self.flavour, self.arch)


def blob_relpath(sha256: str) -> str:
    """Where a content-addressed file lives under a cache root."""
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


@dataclass(frozen=True)
class Package:
    """A verified manifest's files on local disk: the tree (`by_hash=False`) or blobs."""

    manifest: Manifest
    digest: str
    root: Path = Path()
    by_hash: bool = True
    source: str = ""

    def path_of(self, relpath: str) -> Path:
        """The verified local file for a path of the manifest."""
        entry = self.manifest.file(relpath)
        return self.root / (blob_relpath(entry.sha256) if self.by_hash else entry.path)

    def log_fields(self) -> dict[str, Any]:
        m = self.manifest
        return {"driver": m.driver_version, "kernel": m.kernel_release, "flavour": m.flavour,
                "files": len(m.files), "bytes": m.total_size, "source": self.source,
                "digest": self.digest[:12]}

    def to_dict(self) -> dict[str, Any]:
        return {"driver_version": self.manifest.driver_version,
                "kernel_release": self.manifest.kernel_release, "arch": self.manifest.arch,
                "flavour": self.manifest.flavour, "digest": self.digest,
                "source": self.source, "files": len(self.manifest.files),
                "bytes": self.manifest.total_size,
                "modules": [module.name for module in self.manifest.modules]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        m = self.manifest
        return (f"package {m.driver_version} {m.flavour} for kernel {m.kernel_release} "
                f"({m.arch}): {len(m.files)} files, {m.total_size / 1e6:.1f} MB, "
                f"modules {', '.join(x.name for x in m.modules) or 'none'}\n"
                f"digest sha256:{self.digest}\nsource {self.source}")


# ---------------------------------------------------------------- validation


def _fail(where: str, problem: str) -> ManifestError:
    return ManifestError(f"manifest {where}: {problem}")


def check_relpath(value: Any, where: str) -> str:
    """A package-relative POSIX path: no absolute, `..`, `.`, empty part or backslash."""
    if not isinstance(value, str) or not value:
        raise _fail(where, "must be a non-empty string")
    if len(value) > MAX_PATH_CHARS or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise _fail(where, f"{value[:80]!r} is too long or has control characters")
    if value.startswith("/") or "\\" in value:
        raise _fail(where, f"{value!r} must be relative and use '/' (no absolute path or '\\')")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _fail(where, f"{value!r} has an empty, '.' or '..' component")
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in parts):
        raise _fail(where, f"{value[:80]!r}... has a component longer than {NAME_MAX} bytes, "
                    "which no Linux filesystem can create")
    return value


def _check_keys(obj: Any, required: set[str], where: str, optional: frozenset[str] = frozenset()
                ) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _fail(where, "must be a JSON object")
    missing = sorted(required - obj.keys())
    unknown = sorted(obj.keys() - required - optional)
    if missing:
        raise _fail(where, f"missing {', '.join(missing)}")
    if unknown:
        raise _fail(where, f"unknown field {', '.join(unknown)}")
    return obj


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, f"{value!r} must be an integer from {low} to {high}")
    return value


def _match(value: Any, pattern: re.Pattern[str], where: str, accepted: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise _fail(where, f"{str(value)[:80]!r} must be {accepted}")
    return value


def _one_of(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise _fail(where, f"{str(value)[:80]!r} must be one of {', '.join(choices)}")
    return str(value)


def _parse_file(obj: Any, where: str) -> FileEntry:
    obj = _check_keys(obj, _FILE_KEYS, where)
    return FileEntry(
        path=check_relpath(obj["path"], f"{where}.path"),
        size=_int(obj["size"], f"{where}.size", 0, MAX_FILE_SIZE),
        sha256=_match(obj["sha256"], _SHA256_RE, f"{where}.sha256", "64 lowercase hex digits"),
        mode=_int(obj["mode"], f"{where}.mode", 0, 0o777),
        kind=_one_of(obj["kind"], KINDS, f"{where}.kind"))


def _parse_files(value: Any) -> tuple[FileEntry, ...]:
    if not isinstance(value, list) or len(value) > MAX_FILES:
        raise _fail("files", f"must be a list of at most {MAX_FILES} entries")
    files = tuple(_parse_file(item, f"files[{i}]") for i, item in enumerate(value))
    _check_tree_shape([entry.path for entry in files], "files")
    total = sum(entry.size for entry in files)
    if total > MAX_TOTAL_SIZE:
        raise _fail("files", f"total size {total} exceeds {MAX_TOTAL_SIZE} bytes")
    return files


def _check_tree_shape(paths: list[str], where: str) -> None:
    """No duplicates, nothing named manifest.json, no file that is also a directory."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise _fail(where, f"duplicate path {path!r}")
        if path == MANIFEST_NAME:
            raise _fail(where, f"{MANIFEST_NAME!r} is reserved")
        seen.add(path)
    dirs = {str(parent) for path in paths for parent in PurePosixPath(path).parents}
    clash = sorted(seen & dirs)
    if clash:
        raise _fail(where, f"{clash[0]!r} is both a file and a directory")


def _parse_links(value: Any, files: tuple[FileEntry, ...]) -> tuple[LinkEntry, ...]:
    if not isinstance(value, list):
        raise _fail("links", "must be a list")
    file_paths = {entry.path for entry in files}
    links = []
    for i, item in enumerate(value):
        obj = _check_keys(item, _LINK_KEYS, f"links[{i}]")
        path = check_relpath(obj["path"], f"links[{i}].path")
        target = obj["target"]
        resolved = PurePosixPath(path).parent / str(target)
        if not isinstance(target, str) or "/" in target or str(resolved) not in file_paths:
            raise _fail(f"links[{i}].target", f"{str(target)[:80]!r} must name a file of the "
                        "package in the link's own directory")
        links.append(LinkEntry(path, target))
    _check_tree_shape([entry.path for entry in files] + [link.path for link in links],
                      "links")
    return tuple(links)


def _parse_os(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value or not all(
            key in _OS_KEYS and isinstance(text, str) for key, text in value.items()):
        raise _fail("os", f"must be null or an object of {', '.join(_OS_KEYS)} strings")
    return dict(value)


def manifest_from_dict(obj: Any) -> Manifest:
    """Validate a decoded manifest strictly and build the Manifest, or raise ManifestError."""
    obj = _check_keys(obj, _TOP_KEYS, "root", _OPTIONAL_TOP_KEYS)
    version = obj["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise _fail("schema_version", f"{version!r} is not supported (this installer reads "
                    f"{SCHEMA_VERSION}); upgrade the installer or rebuild the package")
    files = _parse_files(obj["files"])
    modules = parse_modules(obj["modules"], {f.path for f in files if f.kind == "module"},
                            _fail)
    links = _parse_links(obj.get("links", []), files)
    clash = staged_clash(files, links)  # two entries landing on one staged path (placement)
    if clash is not None:
        raise _fail("files", clash)
    return Manifest(
        schema_version=SCHEMA_VERSION,
        driver_version=_match(obj["driver_version"], DRIVER_VERSION_RE, "driver_version",
                              "a driver version like 535.261.03"),
        kernel_release=_match(obj["kernel_release"], KERNEL_RELEASE_RE, "kernel_release",
                              "a kernel release like 6.1.0-26-cloud-amd64"),
        arch=_one_of(obj["arch"], ARCHES, "arch"),
        flavour=_one_of(obj["flavour"], FLAVOURS, "flavour"),
        os=_parse_os(obj["os"]),
        files=files,
        modules=modules,
        links=links,
        signatures=parse_signatures(obj.get("signatures", []), {
            f.path for f in files if f.kind == "module"}, _fail),
        provenance=provenance_of(obj, _fail),
        ima=parse_ima(obj.get("ima", []), {f.path for f in files if f.kind == "firmware"},
                      _fail),
        daemons=parse_daemons(obj.get("daemons", {}), files, _fail),
        optional_modules=_parse_optional(obj.get("optional_modules", []), files, modules),
    )


def _parse_optional(value: Any, files: tuple[FileEntry, ...], modules: tuple[ModuleEntry, ...]
                    ) -> tuple[ModuleEntry, ...]:
    """`optional_modules`: shaped like `modules`, never one of them (name or file)."""
    optional = parse_modules(value, {f.path for f in files if f.kind == "module"}, _fail,
                             "optional_modules")
    names = {m.name.replace("-", "_") for m in modules} | {m.file for m in modules}
    for i, entry in enumerate(optional):
        if entry.name.replace("-", "_") in names or entry.file in names:
            raise _fail(f"optional_modules[{i}]", f"{entry.name!r} is also in modules")
    return optional


def load_json(data: bytes, what: str, limit: int, source: str = "") -> dict[str, Any]:
    """Decode a bounded JSON document (`read_document`), failures as one ManifestError."""
    return read_document(data, name=what, source=source, limit=limit, error=ManifestError)


def parse_manifest(data: bytes, source: str = "") -> Manifest:
    """Parse and validate manifest.json bytes; errors name the manifest and `source`."""
    obj = load_json(data, MANIFEST_NAME, MAX_MANIFEST_BYTES, source)
    try:
        return manifest_from_dict(obj)
    except ManifestError as exc:
        if not source:
            raise
        problem = exc.message.removeprefix("manifest ")
        raise ManifestError(f"{MANIFEST_NAME} from {source}: {problem}") from None


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    """The JSON shape of a manifest (the inverse of `manifest_from_dict`)."""
    data: dict[str, Any] = {
        "schema_version": manifest.schema_version, "driver_version": manifest.driver_version,
        "kernel_release": manifest.kernel_release, "arch": manifest.arch,
        "flavour": manifest.flavour, "os": manifest.os,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "mode": f.mode,
                   "kind": f.kind} for f in manifest.files],
        "modules": [{"name": m.name, "file": m.file, "depends": list(m.depends),
                     "params": dict(m.params)} for m in manifest.modules],
    }
    if manifest.links:
        data["links"] = [{"path": link.path, "target": link.target} for link in manifest.links]
    if manifest.signatures:
        data["signatures"] = signatures_to_list(manifest.signatures)
    if manifest.provenance is not None:
        data["provenance"] = manifest.provenance
    if manifest.ima:
        data["ima"] = ima_to_list(manifest.ima)
    if manifest.daemons:
        data["daemons"] = daemons_to_dict(manifest.daemons, manifest.files)
    if manifest.optional_modules:
        data["optional_modules"] = [{"name": m.name, "file": m.file, "depends": list(m.depends),
                                     "params": dict(m.params)}
                                    for m in manifest.optional_modules]
    return data


def dump_manifest(manifest: Manifest) -> bytes:
    """Canonical manifest.json bytes (the package digest is their sha256)."""
    return (json.dumps(manifest_to_dict(manifest), indent=1) + "\n").encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
