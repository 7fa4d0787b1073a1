"""Canonical's signed NVIDIA modules and their user-mode packages, by name from an Ubuntu
archive (`package build --ubuntu-modules-from-apt`, and the fetch stage's Ubuntu source).

For a kernel K and a branch B (`535`, `535-server`) the packages are the ones NVIDIA's
gpu-driver-container installs on its Ubuntu "precompiled" images
(NVIDIA/gpu-driver-container @ 06a208ca9747c82b1ba99b76ecdcf2469b0a0207,
`ubuntu24.04/precompiled/local-repo.sh` `download_driver_package_deps` and `nvidia-driver`
`_install_driver`): `linux-modules-nvidia-B-open-K` (the open flavour's signed modules),
`libnvidia-compute-B` and `nvidia-utils-B`; the GSP firmware the open modules load is
`nvidia-firmware-B-<driver version>` (that script gets it as a dependency, by
`apt-cache depends --recurse`, and never names it). All live in the archive's `restricted`
component. Each comes through `AptArchive` (InRelease checked by gpgv, Packages and .deb by
the signed hashes). The driver version is what the modules' own `.modinfo` says; each
user-mode package must be of that upstream version (the highest Debian revision of it), or
nothing is built.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from installer.errors import PackageNotFoundError
from installer.packages.builder.aptarchive import AptArchive, Stanza, choose
from installer.packages.builder.inputs import PackageBuildError, scan_modules
from installer.packages.builder.ubuntumodules import unpack

UBUNTU_MIRRORS = {"x86_64": "http://archive.ubuntu.com/ubuntu",
                  "aarch64": "http://ports.ubuntu.com/ubuntu-ports"}
COMPONENTS = ("restricted",)
# Ubuntu releases by os-release VERSION_ID (their VERSION_CODENAME): the suite to read
CODENAMES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble", "24.10": "oracular",
             "25.04": "plucky", "25.10": "questing", "26.04": "resolute"}
_BRANCH_RE = re.compile(r"^R?(\d{3,4})(-server)?$")
_MODULES_RE = r"linux-modules-nvidia-(?P<branch>\d{3,4})(?P<server>-server)?-open-"


@dataclass(frozen=True, order=True)
class Branch:
    """An Ubuntu driver branch: its number and whether it is the `-server` (ERD) series."""

    number: str
    server: bool = False

    @property
    def suffix(self) -> str:
        return f"{self.number}-server" if self.server else self.number

    def modules_package(self, kernel: str) -> str:
        return f"linux-modules-nvidia-{self.suffix}-open-{kernel}"

    def user_packages(self, version: str) -> tuple[str, ...]:
        return (f"libnvidia-compute-{self.suffix}", f"nvidia-utils-{self.suffix}",
                f"nvidia-firmware-{self.suffix}-{version}")


@dataclass(frozen=True)
class UbuntuDebs:
    """The verified .debs of one build: the modules' package and the user-mode ones."""

    modules: Path
    user: tuple[Path, ...]
    driver_version: str


def parse_branch(spec: str) -> Branch:
    """`535`, `R535`, `535-server` -> Branch; anything else is one line, exit 2."""
    match = _BRANCH_RE.match(spec)
    if match is None:
        raise PackageBuildError(f"--ubuntu-modules-from-apt {spec!r} is not an Ubuntu driver "
                                "branch", remedy="e.g. --ubuntu-modules-from-apt 535-server "
                                "(or 570, 570-server)")
    return Branch(match[1], match[2] is not None)


def pockets(suites: Iterable[str]) -> tuple[str, ...]:
    """One release suite alone (`jammy`) means it and its `-updates` and `-security`
    pockets; suites with a pocket, or several, are read as given."""
    given = tuple(suites)
    if len(given) == 1 and "-" not in given[0]:
        return (given[0], f"{given[0]}-updates", f"{given[0]}-security")
    return given


def family(kernel: str, branches: Iterable[Branch] = ()) -> re.Pattern[str]:
    """The names read from the Packages indexes: the open modules of `kernel` (every
    branch: a refusal names those there are) and the branches' user-mode packages (every
    branch's when none is named)."""
    wanted = tuple(branches)
    numbers = "|".join(sorted({b.number for b in wanted})) or r"\d{3,4}"
    return re.compile(rf"linux-modules-nvidia-\d{{3,4}}(?:-server)?-open-{re.escape(kernel)}"
                      rf"|(?:libnvidia-compute|nvidia-utils)-(?:{numbers})(?:-server)?"
                      rf"|nvidia-firmware-(?:{numbers})(?:-server)?-\S+")


def offered(index: dict[str, list[Stanza]], kernel: str) -> dict[Branch, str]:
    """Branch -> driver version the archive offers for `kernel`: the branches whose open
    modules are built for it, each at its highest libnvidia-compute upstream version (which
    the modules must match when fetched)."""
    found: dict[Branch, str] = {}
    pattern = re.compile(_MODULES_RE + re.escape(kernel) + "$")
    for name in index:
        match = pattern.match(name)
        if match is None:
            continue
        branch = Branch(match["branch"], match["server"] is not None)
        libraries = index.get(f"libnvidia-compute-{branch.suffix}", [])
        if libraries:
            found[branch] = upstream(choose(libraries[0].name, index, None).version)
    return found


def fetch(archive: AptArchive, suites: tuple[str, ...], kernel: str, branch: Branch,
          work: Path, *, driver_version: str | None = None,
          index: dict[str, list[Stanza]] | None = None) -> UbuntuDebs:
    """The branch's signed open modules for `kernel` and the user-mode packages of their
    driver version, verified, in `work` (refusals name the package and the archive);
    `index`: what `archive.index` already read for `family(kernel)`."""
    if index is None:
        index = archive.index(suites, COMPONENTS, family(kernel, (branch,)))
    name = branch.modules_package(kernel)
    if name not in index:
        others = sorted(n.removeprefix("linux-modules-nvidia-") for n in index
                        if n.startswith("linux-modules-nvidia-"))
        raise PackageNotFoundError(
            f"{archive.mirror} {'/'.join(suites)} restricted has no {name}: Canonical "
            f"publishes no signed open modules of branch {branch.suffix} for kernel {kernel}"
            + (f" (it has {', '.join(others)})" if others else ""),
            remedy="use a branch built for this kernel, a kernel Ubuntu still builds them "
                   "for, or another driver source (DRIVER_MIRRORS, BUILD_FALLBACK)")
    modules = archive.download(choose(name, index, None), work / "modules")
    version = modules_version(modules, work / "probe", kernel)
    if driver_version is not None and driver_version != version:
        raise PackageNotFoundError(
            f"Canonical's {name} is driver {version}, not the requested {driver_version}",
            remedy=f"request {version} (or branch {branch.number})")
    user = tuple(archive.download(_of_version(package, index, version, name), work / "user")
                 for package in branch.user_packages(version))
    return UbuntuDebs(modules, user, version)


def modules_version(deb: Path, work: Path, kernel: str) -> str:
    """The driver version of the `nvidia` module in Canonical's .deb (its `.modinfo`)."""
    try:
        found = unpack((deb,), work, kernel)
        versions = {m.version for m in scan_modules(found.modules_dir) if m.name == "nvidia"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(versions) != 1 or None in versions:
        raise PackageBuildError(f"{deb.name} has no nvidia module with a version",
                                remedy="use Canonical's unmodified package")
    return str(versions.pop())


def _of_version(package: str, index: dict[str, list[Stanza]], version: str,
                modules: str) -> Stanza:
    """The highest Debian revision of `package` whose upstream version is `version`."""
    from debian.debian_support import Version

    same = [s for s in index.get(package, []) if upstream(s.version) == version]
    if not same:
        have = sorted({s.version for s in index.get(package, [])}, key=Version)
        raise PackageNotFoundError(
            f"the archive has no {package} of driver {version}, the version of {modules}"
            + (f" (it has {', '.join(have)})" if have else ""),
            remedy="the user-mode packages must be the modules' driver version: wait until "
                   "the mirror has synced both, or use a mirror that has")
    return max(same, key=lambda s: Version(s.version))


def upstream(version: str) -> str:
    """Debian's `[epoch:]upstream[-revision]` -> upstream (`535.261.03-0ubuntu1` ->
    `535.261.03`)."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]
