"""`--kernel-headers-from-apt linux-headers-<release>` (a kernel's headers .debs by name)
and `--nvidia-source-from-apt nvidia-kernel-source[=VERSION]` (NVIDIA's module sources).

A build farm's pods should need no pre-staged files: the packages come from a Debian or
Ubuntu archive (`--apt-mirror`), read the way apt reads it (`aptarchive.AptArchive`: each
suite's InRelease checked by `gpgv` against `--apt-keyring`, each Packages index and .deb
against the hashes signed for it, through the project's downloader). With several suites
(Ubuntu's pockets: `jammy`, `jammy-updates`, `jammy-security`) the highest version found in
any of them wins.

The headers package brings the packages its build tree needs, as its dependencies name
them: Debian's `linux-headers-<abi>-common` and `linux-kbuild-X.Y`; Ubuntu's flavour
package (`linux-headers-<ver>-<abi>-<flavour>`) the tree its files link into,
`linux-headers-<ver>-<abi>` for Ubuntu's own kernel and `linux-<flavour>-headers-<ver>-<abi>`
for a derivative one (`linux-gcp-headers-5.15.0-1049`), per Ubuntu's
`debian.master/control.d/flavour-control.stub` (`SRCPKGNAME-headers-PKGVER-ABINUM`).
"""

from __future__ import annotations

import re
from pathlib import Path

from installer.packages.builder.aptarchive import AptArchive, Stanza, choose, satisfies
from installer.packages.builder.inputs import PackageBuildError

__all__ = ["AptArchive", "default_suites", "fetch_headers", "fetch_sources"]

_NAME_RE = re.compile(r"^linux-headers-[A-Za-z0-9][A-Za-z0-9.+~-]{0,120}$")
# what a headers package's closure follows: Debian's -common and kbuild, Ubuntu's common
# headers of its own kernel (linux-headers-<ver>-<abi>) and of derivatives (linux-gcp-...)
_COMPANION_RE = re.compile(r"^linux(?:-[a-z0-9][a-z0-9.+]*)*-(?:headers|kbuild)-[0-9]")
_HEADERS_FAMILY = re.compile(r"linux(?:-[a-z0-9][a-z0-9.+]*)*-(?:headers|kbuild)-[0-9]\S*")
_SOURCE_RE = re.compile(r"^(nvidia(?:-open)?-kernel-source)(?:=([A-Za-z0-9.+~:-]{1,80}))?$")
_SOURCES_FAMILY = re.compile(r"nvidia(?:-open)?-kernel-source")
_HEADERS_COMPONENTS = ("main",)
# NVIDIA's sources: Debian's non-free and contrib, Ubuntu's restricted and multiverse
_SOURCES_COMPONENTS = ("main", "contrib", "non-free", "restricted", "multiverse")


def default_suites(name: str) -> tuple[str, ...]:
    """The suite of a Debian headers package: trixie's releases say `+deb13`, bookworm's
    nothing (Ubuntu's archive needs --apt-suite: its releases name no suite)."""
    return ("trixie",) if "+deb13" in name else ("bookworm",)


def fetch_headers(names: tuple[str, ...], archive: AptArchive, suites: tuple[str, ...],
                  work: Path) -> tuple[Path, ...]:
    """Each named headers package and the headers/kbuild packages it depends on, verified,
    in `work`."""
    for name in names:
        if not _NAME_RE.match(name):
            raise PackageBuildError(f"--kernel-headers-from-apt {name!r} is not a "
                                    "linux-headers-<release> package name",
                                    remedy="e.g. --kernel-headers-from-apt "
                                           "linux-headers-6.1.0-57-amd64")
    debs: dict[str, Path] = {}
    for name in names:
        index = archive.index(suites or default_suites(name), _HEADERS_COMPONENTS,
                              _HEADERS_FAMILY)
        for stanza in _closure(name, index):
            if stanza.filename not in debs:
                debs[stanza.filename] = archive.download(stanza, work)
    return tuple(debs.values())


def fetch_sources(specs: tuple[str, ...], archive: AptArchive, suites: tuple[str, ...],
                  work: Path) -> tuple[Path, ...]:
    """Each `nvidia[-open]-kernel-source[=VERSION]` .deb (the highest version when none is
    named), verified, in `work`."""
    wanted = []
    for spec in specs:
        match = _SOURCE_RE.match(spec)
        if match is None:
            raise PackageBuildError(f"--nvidia-source-from-apt {spec!r} is not "
                                    "nvidia-kernel-source or nvidia-open-kernel-source "
                                    "[=VERSION]", remedy="e.g. --nvidia-source-from-apt "
                                    "nvidia-kernel-source=535.261.03-1")
        wanted.append((match[1], match[2]))
    index = archive.index(suites or ("bookworm",), _SOURCES_COMPONENTS, _SOURCES_FAMILY)
    return tuple(archive.download(choose(name, index, ("=", version) if version else None),
                                  work) for name, version in wanted)


def _closure(name: str, index: dict[str, list[Stanza]]) -> list[Stanza]:
    """The package and its headers/kbuild dependencies (the build tree needs them): an
    exact version where the dependency names one, else the version of the package that
    depends on it when the archive has it (one upload of one kernel), else the highest."""
    wanted: list[tuple[str, tuple[str, str] | None, str | None]] = [(name, None, None)]
    chosen: dict[str, Stanza] = {}
    while wanted:
        package, relation, parent = wanted.pop()
        if package in chosen:
            continue
        same = [s for s in index.get(package, []) if s.version == parent
                and (relation is None or satisfies(s.version, relation))]
        chosen[package] = stanza = same[0] if same else choose(package, index, relation)
        wanted += [(dep, rel, stanza.version) for dep, rel in stanza.depends
                   if _COMPANION_RE.match(dep)]
    return [chosen[key] for key in sorted(chosen)]
