"""Repositories: the index.json format and resolving a requested driver version for a node.

`resolve()` is the one place a version is chosen: it takes every candidate the sources
offer, the node, and an optional `allowed` filter (the compatibility check plugs in
there), so every policy applies to every source alike. See docs/package-format.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import PackageNotFoundError
from installer.packages.documents import read_document
from installer.packages.manifest import (
    ARCHES,
    DRIVER_VERSION_RE,
    FLAVOURS,
    KERNEL_RELEASE_RE,
    ManifestError,
)
from installer.packages.manifest import package_path as package_path

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo

INDEX_NAME = "index.json"
INDEX_SCHEMA_VERSION = 1
MAX_INDEX_BYTES = 16 * 1024**2
MAX_INDEX_PACKAGES = 50_000
TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_BRANCH_RE = re.compile(r"^\d{3,4}$")
_ALIAS_NAME_RE = re.compile(r"^(default|latest|\d{3,4})$")
_ENTRY_KEYS = {"driver_version", "kernel_release", "arch", "flavour", "path", "manifest_sha256",
               "os"}

Allowed = Callable[["Candidate"], bool]


class IndexFormatError(ManifestError):
    """index.json breaks the repository format."""

    default_remedy = "regenerate index.json with `gpu-node-installer package build --repo`"


@dataclass(frozen=True)
class Candidate:
    """A package some source offers: identity, where it sits, and its manifest digest."""

    driver_version: str
    kernel_release: str
    arch: str
    flavour: str
    path: str
    manifest_sha256: str | None = None
    os: dict[str, str] | None = None
    source: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kernel_release, self.arch, self.driver_version, self.flavour)


@dataclass(frozen=True)
class Index:
    """A repository's index: the packages it holds and its version aliases."""

    packages: tuple[Candidate, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key: 535.261.03 > 535.54.03 (string order would say otherwise)."""
    return tuple(int(part) for part in version.split("."))


def branch_of(version: str) -> str:
    return version.split(".", 1)[0]


# ---------------------------------------------------------------- index.json


def _bad(where: str, problem: str) -> IndexFormatError:
    return IndexFormatError(f"index.json {where}: {problem}")


def _text(obj: dict[str, Any], key: str, pattern: re.Pattern[str], where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise _bad(f"{where}.{key}", f"{str(value)[:80]!r} is not valid")
    return value


def _candidate(obj: Any, where: str, source: str) -> Candidate:
    if not isinstance(obj, dict) or not {"driver_version", "kernel_release", "arch",
                                         "flavour"} <= obj.keys() or obj.keys() - _ENTRY_KEYS:
        raise _bad(where, f"must be an object with fields {', '.join(sorted(_ENTRY_KEYS))}")
    arch, flavour = obj["arch"], obj["flavour"]
    if arch not in ARCHES or flavour not in FLAVOURS:
        raise _bad(where, f"arch {arch!r} or flavour {flavour!r} is not known")
    version = _text(obj, "driver_version", DRIVER_VERSION_RE, where)
    kernel = _text(obj, "kernel_release", KERNEL_RELEASE_RE, where)
    expected = package_path(kernel, version, flavour, arch)
    if obj.get("path", expected) != expected:
        raise _bad(f"{where}.path", f"must be {expected!r}")
    digest = obj.get("manifest_sha256")
    if digest is not None and (not isinstance(digest, str) or not _SHA256_RE.match(digest)):
        raise _bad(f"{where}.manifest_sha256", "must be 64 lowercase hex digits")
    os_match = obj.get("os")
    if os_match is not None and not (isinstance(os_match, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in os_match.items())):
        raise _bad(f"{where}.os", "must be null or an object of strings")
    return Candidate(version, kernel, arch, flavour, expected, digest, os_match, source)


def _aliases(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _bad("aliases", "must be an object")
    for name, target in value.items():
        if not _ALIAS_NAME_RE.match(name):
            raise _bad(f"aliases.{name}", "alias names are default, latest or a branch")
        if not isinstance(target, str) or not (DRIVER_VERSION_RE.match(target)
                                               or _BRANCH_RE.match(target)):
            raise _bad(f"aliases.{name}", f"{str(target)[:40]!r} is not a version or branch")
    return dict(value)


def parse_index(data: bytes, source: str = "") -> Index:
    """Parse and validate index.json bytes; errors name the index and `source`."""
    obj = read_document(data, name=INDEX_NAME, source=source, limit=MAX_INDEX_BYTES,
                        error=IndexFormatError)
    try:
        return _index_from_dict(obj, source)
    except IndexFormatError as exc:
        if not source:
            raise
        problem = exc.message.removeprefix(f"{INDEX_NAME} ")
        raise IndexFormatError(f"{INDEX_NAME} from {source}: {problem}") from None


def _index_from_dict(obj: dict[str, Any], source: str) -> Index:
    if obj.keys() - {"schema_version", "packages", "aliases"}:
        raise _bad("root", "must be an object of schema_version, packages, aliases")
    if obj.get("schema_version") != INDEX_SCHEMA_VERSION:
        raise _bad("schema_version", f"{obj.get('schema_version')!r} is not supported "
                   f"(this installer reads {INDEX_SCHEMA_VERSION})")
    packages = obj.get("packages", [])
    if not isinstance(packages, list) or len(packages) > MAX_INDEX_PACKAGES:
        raise _bad("packages", f"must be a list of at most {MAX_INDEX_PACKAGES}")
    entries = tuple(_candidate(item, f"packages[{i}]", source) for i, item in enumerate(packages))
    if len({entry.key for entry in entries}) != len(entries):
        raise _bad("packages", "lists the same kernel/arch/version/flavour twice")
    return Index(entries, _aliases(obj.get("aliases", {})))


def index_to_bytes(index: Index) -> bytes:
    packages = sorted(index.packages, key=lambda c: (c.kernel_release, c.arch,
                                                     version_key(c.driver_version), c.flavour))
    data = {"schema_version": INDEX_SCHEMA_VERSION,
            "aliases": dict(sorted(index.aliases.items())),
            "packages": [{"driver_version": c.driver_version, "kernel_release": c.kernel_release,
                          "arch": c.arch, "flavour": c.flavour, "path": c.path,
                          "manifest_sha256": c.manifest_sha256, "os": c.os}
                         for c in packages]}
    return (json.dumps(data, indent=1) + "\n").encode()


def with_package(index: Index, candidate: Candidate, aliases: dict[str, str] | None = None
                 ) -> Index:
    """The index with `candidate` added (replacing one of the same identity) and aliases set."""
    kept = tuple(c for c in index.packages if c.key != candidate.key)
    return Index((*kept, replace(candidate, source="")), {**index.aliases, **(aliases or {})})


def scan_tree(root: Path, source: str = "") -> list[Candidate]:
    """Packages in a local repository without index.json: `<kernel>/<ver>/<flavour>[.tar*]`."""
    found = []
    for manifest in sorted(root.glob("*/*/*/manifest.json")):
        found.append(_from_parts(manifest.parent.relative_to(root).parts, source))
    for suffix in TARBALL_SUFFIXES:
        for tarball in sorted(root.glob(f"*/*/*{suffix}")):
            kernel, version, name = tarball.relative_to(root).parts
            found.append(_from_parts((kernel, version, name[: -len(suffix)]), source))
    return [c for c in found if c is not None]


def _from_parts(parts: Sequence[str], source: str) -> Candidate | None:
    """A path's identity; a plain `<flavour>` leaves the arch to the manifest (checked
    against the node's when fetched), `<flavour>-<arch>` names it."""
    kernel, version, name = parts
    flavour, _, arch = name.partition("-")
    if (not KERNEL_RELEASE_RE.match(kernel) or not DRIVER_VERSION_RE.match(version)
            or flavour not in FLAVOURS or (arch and arch not in ARCHES[1:])):
        return None
    return Candidate(version, kernel, arch, flavour, package_path(kernel, version, flavour, arch),
                     source=source)


# ---------------------------------------------------------------- resolution


def flavour_order(requested: str, node: NodeInfo) -> tuple[str, ...]:
    """Flavours acceptable for every GPU, the preferred first (`auto`), or the one asked for."""
    if requested != "auto":
        return (requested,)
    gpus = node.gpus
    allowed = [f for f in ("proprietary", "open") if all(f in gpu.flavours for gpu in gpus)]
    if any(gpu.preferred_flavour == "open" for gpu in gpus) and "open" in allowed:
        allowed.remove("open")
        allowed.insert(0, "open")
    return tuple(allowed)


def _os_matches(candidate: Candidate, node: NodeInfo) -> bool:
    if not candidate.os:
        return True
    return all(getattr(node.os, key, None) == value for key, value in candidate.os.items())


def for_node(candidates: Iterable[Candidate], node: NodeInfo, flavours: Sequence[str]
             ) -> list[Candidate]:
    """Candidates built for this node's kernel, arch (when known), OS and flavours."""
    return [c for c in candidates
            if c.kernel_release == node.kernel_release and c.arch in ("", node.kernel_arch)
            and c.flavour in flavours and _os_matches(c, node)]


def _target_version(requested: str, versions: list[str], aliases: dict[str, str]
                    ) -> str | None:
    """The version a request names: an alias in the index wins, else the newest that fits."""
    if DRIVER_VERSION_RE.match(requested):
        return requested
    target = aliases.get(requested, requested if _BRANCH_RE.match(requested) else "")
    if DRIVER_VERSION_RE.match(target):
        return target
    fitting = [v for v in versions if not target or branch_of(v) == target]
    return max(fitting, key=version_key) if fitting else None


def resolve(requested: str, candidates: Sequence[Candidate], node: NodeInfo, *,
            flavour: str = "auto", aliases: dict[str, str] | None = None,
            allowed: Allowed | None = None) -> Candidate:
    """Choose the package for `requested` (exact, branch, default, latest) on `node`.

    Among equal choices the earlier candidate wins, so sources keep their order. Only the
    node's arch is ever chosen; the choice names it even where the source did not.
    """
    flavours = flavour_order(flavour, node)
    fitting = for_node(candidates, node, flavours)
    usable = [c for c in fitting if allowed is None or allowed(c)]
    version = _target_version(requested, [c.driver_version for c in usable], aliases or {})
    for wanted in flavours:
        for candidate in usable:
            if candidate.driver_version == version and candidate.flavour == wanted:
                return replace(candidate, arch=candidate.arch or node.kernel_arch)
    raise PackageNotFoundError(_not_found(requested, version, flavours, node, candidates,
                                          rejected=len(fitting) - len(usable)))


def offered_for_kernel(candidates: Iterable[Candidate], kernel_release: str
                       ) -> dict[str, list[str]]:
    """version -> flavours the sources hold for one kernel, newest version first."""
    table: dict[str, list[str]] = {}
    for c in candidates:
        if c.kernel_release == kernel_release and c.flavour not in table.get(
                c.driver_version, []):
            table.setdefault(c.driver_version, []).append(c.flavour)
    return dict(sorted(table.items(), key=lambda item: version_key(item[0]), reverse=True))


def _not_found(requested: str, version: str | None, flavours: Sequence[str], node: NodeInfo,
               candidates: Sequence[Candidate], *, rejected: int) -> str:
    wanted = requested if version in (None, requested) else f"{requested} (= {version})"
    what = (f"no driver package {wanted} ({'/'.join(flavours) or 'no flavour fits all GPUs'}) "
            f"for kernel {node.kernel_release} {node.kernel_arch}")
    offered = offered_for_kernel(candidates, node.kernel_release)
    if offered:
        listing = ", ".join(f"{v} ({'/'.join(f)})" for v, f in offered.items())
        have = f"the sources have for this kernel: {listing}"
    else:
        kernels = sorted({c.kernel_release for c in candidates})
        have = ("the sources have nothing for this kernel" + (
            f" (they have kernels {', '.join(kernels[:8])})" if kernels else
            " (no source answered with any package)"))
    suffix = f"; {rejected} more refused by the compatibility check" if rejected else ""
    foreign = sorted({c.arch for c in candidates if c.arch not in ("", node.kernel_arch)})
    if foreign:
        suffix += f"; packages for {'/'.join(foreign)} are never used on a {node.kernel_arch} node"
    return f"{what}; {have}{suffix}"
