"""`package index REPO`: write index.json from the packages a build farm's shards left.

Shards (`package build --shard`) write packages and, last, a receipt of each package's
manifest digest (`<repo>/.receipts/<kernel>/<driver>/<flavour>.sha256`); they never touch
index.json. This runs once, after them, so it needs no lock: it lists every package
whose manifest matches its receipt (or, for a package of an earlier `--repo` build, the
old index's digest) and whose every file matches the manifest, refuses duplicates and
misplaced packages, and replaces index.json atomically. The output depends only on the
packages and aliases, so a rerun writes the same bytes. A package with no digest
recorded (a shard killed before its receipt) is left out and named.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, IntegrityError
from installer.node.documents import read_document
from installer.node.files import read_regular
from installer.node.host import write_atomic
from installer.packages.manifest import FLAVOURS, MANIFEST_NAME, MAX_MANIFEST_BYTES, sha256_hex
from installer.packages.repository import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    Candidate,
    Index,
    IndexFormatError,
    index_to_bytes,
    package_path,
    parse_index,
)
from installer.packages.tree import read_tree

RECEIPTS = ".receipts"
_RECEIPT_BYTES = 128


class RepositoryIndexError(IntegrityError):
    """The repository holds a package that cannot be listed (exit 7)."""

    default_remedy = "rebuild that package (rerun its shard), or remove it, then index again"


@dataclass(frozen=True)
class IndexResult:
    """What was listed, what was left out (no digest recorded), and where the index is."""

    index: Path
    listed: tuple[Candidate, ...]
    unrecorded: tuple[str, ...]
    aliases: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"index": str(self.index), "aliases": self.aliases,
                "packages": [c.path for c in self.listed], "unrecorded": list(self.unrecorded)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"index {self.index}: {len(self.listed)} packages"
                 + (f", aliases {json.dumps(self.aliases)}" if self.aliases else "")]
        lines += [f"listed     {c.path} sha256:{(c.manifest_sha256 or '')[:12]}"
                  for c in self.listed]
        lines += [f"not listed {path}: no digest recorded (a shard stopped before its "
                  "receipt); rerun its shard" for path in self.unrecorded]
        return "\n".join(lines)


def receipt_path(repo: Path, kernel_release: str, driver_version: str, flavour: str) -> Path:
    """Where a shard records a package's manifest digest."""
    return repo / RECEIPTS / f"{package_path(kernel_release, driver_version, flavour)}.sha256"


def index_repository(repo: Path, aliases: dict[str, str]) -> IndexResult:
    """Verify every package with a recorded digest and write `<repo>/index.json`."""
    if not repo.is_dir():
        raise RepositoryIndexError(f"repository {repo} is not a directory",
                                   remedy="give the directory the shards wrote into")
    old = _old_index(repo)
    recorded = {c.path: c.manifest_sha256 for c in old.packages if c.manifest_sha256}
    found: list[tuple[Candidate, str]] = []
    unrecorded: list[str] = []
    for place in _places(repo):
        relpath = place.relative_to(repo).as_posix()
        expected = _receipt(repo, relpath) or recorded.get(relpath)
        if expected is None:
            unrecorded.append(relpath)
            continue
        found.append((_verified(place, relpath, expected), relpath))
    listed = _unique(found)
    merged = {**old.aliases, **aliases}
    data = index_to_bytes(Index(listed, merged))
    target = repo / INDEX_NAME
    if not (target.is_file() and target.read_bytes() == data):  # a rerun changes nothing
        write_atomic(target, data)
    ordered = parse_index(data).packages
    return IndexResult(target, ordered, tuple(unrecorded), dict(sorted(merged.items())))


def _old_index(repo: Path) -> Index:
    path = repo / INDEX_NAME
    data = read_regular(path, MAX_INDEX_BYTES, error=RepositoryIndexError, oversize=False,
                        remedy="remove it (it is rewritten from the packages)")
    return Index() if data is None else parse_index(data, str(path))


def _places(repo: Path) -> list[Path]:
    """`<kernel>/<driver>/<flavour>/` directories holding a manifest; temp dirs (dot
    names) of builds in progress or killed are not places. A symbolic link where a
    package or a receipt would be is refused by name (`_refuse_link`)."""
    places = []
    for kernel in _dirs(repo, repo):
        for version in _dirs(repo, kernel):
            for place in _dirs(repo, version):
                if place.name in FLAVOURS and (place / MANIFEST_NAME).is_file():
                    _refuse_link(repo, place / MANIFEST_NAME)
                    receipt = _receipt_file(repo, place)
                    for step in (*reversed(receipt.parents[:3]), receipt):
                        _refuse_link(repo, step)
                    places.append(place)
    return places


def _dirs(repo: Path, parent: Path) -> list[Path]:
    """The real directories of `parent`; a link among them that leads to a package or
    has a receipt is refused (a link elsewhere is none of the index's business)."""
    found = []
    for path in sorted(p for p in parent.iterdir() if not p.name.startswith(".")):
        if path.is_symlink() and _holds_package(repo, path):
            _refuse_link(repo, path)
        if path.is_dir() and not path.is_symlink():
            found.append(path)
    return found


def _holds_package(repo: Path, link: Path) -> bool:
    """Whether a linked directory, at its depth in the repository, holds a package (one
    level down per level to the flavour) or has a receipt recorded for a path under it."""
    relpath = link.relative_to(repo)
    below = "/".join(["*"] * (3 - len(relpath.parts)))
    manifests = link.glob(f"{below}/{MANIFEST_NAME}" if below else MANIFEST_NAME)
    receipts = repo / RECEIPTS / relpath
    return any(m.parent.name in FLAVOURS for m in manifests) or (
        receipts.with_name(receipts.name + ".sha256").exists() or receipts.is_dir())


def _refuse_link(repo: Path, path: Path) -> None:
    """A symbolic link is not listed: `package index` vouches for the bytes in the
    repository, and a link serves whatever it points at when the index is read."""
    if not path.is_symlink():
        return
    relpath = path.relative_to(repo).as_posix()
    raise RepositoryIndexError(
        f"{relpath} in repository {repo} is a symbolic link (to {os.readlink(path)}); "
        "package index lists only packages and receipts stored in the repository",
        remedy=f"replace the link {relpath} with a copy of what it points at (or rebuild "
               "that package into the repository), then index again")


def _receipt_file(repo: Path, place: Path) -> Path:
    return repo / RECEIPTS / f"{place.relative_to(repo).as_posix()}.sha256"


def _receipt(repo: Path, relpath: str) -> str | None:
    path = repo / RECEIPTS / f"{relpath}.sha256"
    data = read_regular(path, _RECEIPT_BYTES, error=RepositoryIndexError,
                        remedy="remove it and rerun that package's shard")
    return None if data is None else data.decode(errors="replace").strip()


def _verified(place: Path, relpath: str, expected: str) -> Candidate:
    """The package at `place`, once its manifest digest and every file check out."""
    data = read_regular(place / MANIFEST_NAME, MAX_MANIFEST_BYTES, oversize=False,
                        error=RepositoryIndexError)
    digest = sha256_hex(data or b"")
    if digest != expected:
        raise RepositoryIndexError(
            f"{relpath}/{MANIFEST_NAME} has sha256 {digest[:16]}..., but its build recorded "
            f"{expected[:16]}...: the manifest was changed or replaced after the build")
    package = read_tree(place)  # every file against the manifest (PackageFileError, exit 7)
    m = package.manifest
    return Candidate(m.driver_version, m.kernel_release, m.arch, m.flavour,
                     package_path(m.kernel_release, m.driver_version, m.flavour), digest, m.os)


def _unique(found: list[tuple[Candidate, str]]) -> tuple[Candidate, ...]:
    """One package per (kernel, arch, driver, flavour), each at the place its manifest names."""
    by_key: dict[tuple[str, str, str, str], tuple[Candidate, str]] = {}
    for candidate, relpath in found:
        seen = by_key.setdefault(candidate.key, (candidate, relpath))
        if seen[1] != relpath and seen[0].manifest_sha256 != candidate.manifest_sha256:
            raise RepositoryIndexError(
                f"{seen[1]} and {relpath} are two different packages (manifest sha256 "
                f"{(seen[0].manifest_sha256 or '')[:12]} and "
                f"{(candidate.manifest_sha256 or '')[:12]}) for kernel "
                f"{candidate.kernel_release}, driver {candidate.driver_version}, flavour "
                f"{candidate.flavour}", remedy="remove the one that is not wanted")
    for candidate, relpath in found:
        if relpath != candidate.path:
            raise RepositoryIndexError(
                f"{relpath} holds the package of {candidate.path} (its manifest says so)",
                remedy=f"move it to {candidate.path}, or remove it")
    return tuple(candidate for candidate, _ in by_key.values())


def parse_aliases(pairs: tuple[str, ...], from_file: Path | None) -> dict[str, str]:
    """Aliases from a file (an index.json, or a JSON object of name -> version) and
    `NAME=VERSION` flags (which win), checked as index.json checks them."""
    aliases: dict[str, str] = {}
    if from_file is not None:
        where = f"--aliases-from {from_file}"
        raw = read_regular(from_file, MAX_INDEX_BYTES, error=ConfigError, name=where)
        if raw is None:
            raise ConfigError(f"{where}: no such file",
                              remedy="give an index.json or a JSON object of name -> version")
        data = read_document(raw, name=where, limit=MAX_INDEX_BYTES, error=ConfigError)
        table = data.get("aliases", data) if isinstance(data, dict) else data
        aliases.update(_checked(table, f"--aliases-from {from_file}"))
    for pair in pairs:
        name, sep, target = pair.partition("=")
        if not sep:
            raise ConfigError(f"--alias {pair!r} is not NAME=VERSION",
                                   remedy="e.g. --alias latest=550.163.01 --alias 535=535")
        aliases.update(_checked({name: target}, f"--alias {pair}"))
    return aliases


def _checked(table: Any, where: str) -> dict[str, str]:
    try:
        return parse_index(json.dumps({"schema_version": 1, "aliases": table}).encode()).aliases
    except IndexFormatError as exc:
        raise ConfigError(f"{where}: {exc.message}",
                               remedy="alias names are default, latest or a branch (535); "
                                      "targets a version or a branch") from None
