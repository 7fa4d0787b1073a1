"""Which driver runs which CUDA toolkit and drives which GPU: the rules over compat_table's facts.

A CUDA toolkit needs only a *minimum* driver (newer drivers run older toolkits, and minor
version compatibility stretches that within a major version), while each GPU generation is
driven only by a range of driver branches and by some kernel-module flavours. Resolution,
`status` and the `compat` command all ask these questions here, so they never disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from installer import compat_table as table
from installer.errors import ConfigError, IncompatibleError
from installer.gpus import ARCHITECTURES

if TYPE_CHECKING:
    from installer.detect import NodeInfo
    from installer.pipeline import Context

Version = tuple[int, ...]

_DRIVER_RE = re.compile(r"^\d{3,4}(\.\d{1,3}){1,2}$")
_BRANCH_RE = re.compile(r"^\d{3,4}$")
_CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d{1,4})?$")
MODE_NATIVE = "native"
MODE_MINOR = "minor-version-compatibility"


class MalformedVersionError(ConfigError):
    """A CUDA toolkit or driver version that is not of the documented form."""


class UnknownCudaError(ConfigError):
    """A well-formed CUDA version outside what the compatibility table covers."""


class NoLoadedDriverError(ConfigError):
    """`compat` without --driver on a node where no NVIDIA driver is loaded."""


class CudaIncompatibleError(IncompatibleError):
    """The driver is older than the CUDA toolkit needs, even with minor version compatibility."""


class DriverUnsupportedGpuError(IncompatibleError):
    """The driver's branch cannot drive a GPU of this node (too old or past its last branch)."""


class FlavourUnsupportedError(IncompatibleError):
    """The kernel-module flavour cannot drive a GPU of this node."""


# ---- versions -----------------------------------------------------------------------------

def parse_driver(text: str, *, what: str = "--driver") -> Version:
    """An exact driver version (`535.261.03`, `570.26`) as numbers, or MalformedVersionError."""
    value = text.strip()
    if not _DRIVER_RE.match(value):
        raise MalformedVersionError(f"{what} {text!r} is not a driver version",
                                    remedy="give an exact driver version like 535.261.03")
    return _numbers(value)


def parse_cuda(text: str) -> Version:
    """A CUDA toolkit version (`12.4` or `12.4.1`) as numbers, or MalformedVersionError."""
    value = text.strip()
    if not _CUDA_RE.match(value):
        raise MalformedVersionError(f"--cuda {text!r} is not a CUDA toolkit version",
                                    remedy="give a CUDA toolkit version like 12.4 or 12.4.1")
    return _numbers(value)


def driver_branch(version: str) -> int:
    """The branch (first number) of a driver version or of a bare branch like `535`."""
    value = version.strip()
    if _BRANCH_RE.match(value):
        return int(value)
    return parse_driver(value, what="driver version")[0]


def _numbers(text: str) -> Version:
    return tuple(int(part) for part in text.split("."))


def _at_least(version: Version, minimum: Version) -> bool:
    """Numeric comparison; missing parts count as 0, so a bare branch `610` means 610.0.0."""
    width = max(len(version), len(minimum))
    return version + (0,) * (width - len(version)) >= minimum + (0,) * (width - len(minimum))


def _show(minimum: str) -> str:
    return f"{minimum}.x" if _BRANCH_RE.match(minimum) else minimum


# ---- CUDA toolkit vs driver -----------------------------------------------------------------

def release_for(cuda: Version) -> table.ToolkitRelease | None:
    """The table row a CUDA version means: `X.Y` is that minor's GA, `X.Y.Z` the newest
    release at or below it (its GA when none is); None when the table lacks that minor."""
    rows = [row for row in table.TOOLKIT_RELEASES if _numbers(row.version)[:2] == cuda[:2]]
    if not rows:
        return None
    ga = next((row for row in rows if not row.prerelease), rows[0])
    if len(cuda) == 2:
        return ga
    exact = [row for row in rows if _numbers(row.version) == cuda]
    if exact:
        return exact[0]
    below = [row for row in rows if not row.prerelease and _numbers(row.version) <= cuda]
    return below[-1] if below else ga


def minimum_driver_for_cuda(cuda: str) -> str | None:
    """The oldest driver a CUDA version needs natively (None when the table lacks it)."""
    release = release_for(parse_cuda(cuda))
    return release.min_driver if release else None


def _minor(release: table.ToolkitRelease) -> str:
    return ".".join(release.version.split(".")[:2])


def _releases_met(driver: Version) -> list[table.ToolkitRelease]:
    return [row for row in table.TOOLKIT_RELEASES
            if not row.prerelease and _at_least(driver, _numbers(row.min_driver))]


def max_cuda_for_driver(version: str) -> str | None:
    """The newest CUDA toolkit (`X.Y`) a driver runs natively; None for a driver older than
    every toolkit in the table, or for text that is not a driver version."""
    try:
        driver = parse_driver(version, what="driver version")
    except MalformedVersionError:
        return None
    met = _releases_met(driver)
    return _minor(met[-1]) if met else None


def minor_compat_major(version: str) -> int | None:
    """The newest CUDA major whose every minor release this driver runs through minor
    version compatibility (535 -> 12), or None."""
    try:
        driver = parse_driver(version, what="driver version")
    except MalformedVersionError:
        return None
    majors = [major for major, floor in table.MINOR_VERSION_FLOORS.items()
              if _at_least(driver, _numbers(floor))]
    return max(majors) if majors else None


def cuda_support(version: str | None) -> dict[str, Any]:
    """What `status` shows for a driver: the newest toolkit it runs natively, and the CUDA
    major whose every minor release it runs through minor version compatibility."""
    return {"driver": version,
            "max_toolkit": max_cuda_for_driver(version) if version else None,
            "minor_version_compat_major": minor_compat_major(version) if version else None}


def cuda_support_text(version: str | None) -> str:
    """One line for `status`."""
    support = cuda_support(version)
    if version is None:
        return "no driver loaded"
    newest = support["max_toolkit"] or "none in the table"
    major = support["minor_version_compat_major"]
    return f"up to CUDA {newest}" + (f" (any {major}.x through minor version compatibility)"
                                     if major is not None else "")


@dataclass(frozen=True)
class CudaVerdict:
    """Whether one driver runs one CUDA toolkit, and why (the `compat` command's result)."""

    cuda: str
    driver: str
    compatible: bool
    mode: str | None
    release: str | None
    minimum_driver: str | None
    minor_version_floor: str | None
    max_cuda: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        newest = self.max_cuda or "none in the table"
        major = minor_compat_major(self.driver)
        if major is not None:
            newest += f" (and any {major}.x through minor version compatibility)"
        return "\n".join([
            f"compatible: {'yes' if self.compatible else 'no'} "
            f"(CUDA {self.cuda} on driver {self.driver})",
            f"reason:     {self.reason}",
            f"newest CUDA toolkit this driver supports: {newest}",
        ])

    def log_fields(self) -> dict[str, Any]:
        return {"cuda": self.cuda, "driver": self.driver, "compatible": self.compatible,
                "mode": self.mode}


def check_cuda(cuda: str, driver: str) -> CudaVerdict:
    """Does `driver` run applications built with CUDA toolkit `cuda`?"""
    cuda_v, driver_v = parse_cuda(cuda), parse_driver(driver)
    release = release_for(cuda_v)
    floor = table.MINOR_VERSION_FLOORS.get(cuda_v[0])
    if release is None and floor is None:
        first, last = table.TOOLKIT_RELEASES[0], table.TOOLKIT_RELEASES[-1]
        raise UnknownCudaError(
            f"CUDA {cuda} is not in the compatibility table ({_minor(first)} to {_minor(last)})",
            remedy=f"give a CUDA toolkit version from {_minor(first)} to {_minor(last)}")
    mode, reason = _judge(cuda, cuda_v, driver, driver_v, release, floor)
    return CudaVerdict(
        cuda=cuda, driver=driver, compatible=mode is not None, mode=mode,
        release=release.label if release else None,
        minimum_driver=release.min_driver if release else None, minor_version_floor=floor,
        max_cuda=max_cuda_for_driver(driver), reason=reason)


def _judge(cuda: str, cuda_v: Version, driver: str, driver_v: Version,
           release: table.ToolkitRelease | None, floor: str | None) -> tuple[str | None, str]:
    """The compatibility mode (None: incompatible) and a one-sentence reason."""
    needs = f"{release.label} needs driver >= {_show(release.min_driver)}" if release else (
        f"CUDA {cuda} is newer than this table (its own minimum driver is not recorded)")
    if release and _at_least(driver_v, _numbers(release.min_driver)):
        return MODE_NATIVE, f"{needs}; {driver} meets it"
    minor = f"CUDA {cuda_v[0]}.x minor version compatibility"
    if floor and _at_least(driver_v, _numbers(floor)):
        older = f"{driver} is older, but " if release else ""
        return MODE_MINOR, (f"{needs}; {older}{minor} runs it on >= {floor} "
                            "(features that need a newer driver will fail)")
    also = f" (>= {floor} through {minor})" if floor else ""
    return None, f"{needs}{also}; {driver} is older"


def raise_if_incompatible(verdict: CudaVerdict) -> None:
    """`compat` exits 14 on "no", after printing the verdict, so scripts can branch on it."""
    if verdict.compatible:
        return
    target = verdict.minimum_driver or verdict.minor_version_floor or "a newer driver"
    raise CudaIncompatibleError(
        f"driver {verdict.driver} does not run CUDA {verdict.cuda}",
        remedy=f"install driver {_show(target)} or newer, or build the application "
               "with an older CUDA toolkit")


def run_check(cuda: str, driver: str | None, node: Callable[[], Context]) -> CudaVerdict:
    """The `compat` command: against --driver, else against the driver loaded on the node."""
    parse_cuda(cuda)
    if driver is None:
        from installer import kmod

        ctx = node()
        loaded = kmod.loaded_driver(ctx.host)
        if loaded is None:
            raise NoLoadedDriverError("no NVIDIA driver is loaded on this node",
                                      remedy="pass --driver VERSION to check a driver by number")
        driver = loaded.version
    return check_cuda(cuda, driver)


# ---- GPU architecture vs driver branch and flavour ------------------------------------------

def _range(architecture: str) -> table.BranchRange:
    return table.ARCHITECTURE_BRANCHES.get(architecture, table.BranchRange(None, None))


def branch_supports(branch: int, architecture: str) -> bool:
    """Does this driver branch drive GPUs of this architecture?"""
    bounds = _range(architecture)
    return ((bounds.first is None or branch >= bounds.first)
            and (bounds.last is None or branch <= bounds.last))


def supported_range(architectures: Iterable[str]) -> table.BranchRange:
    """The branches that drive every listed architecture (first > last: none does)."""
    firsts = [b.first for b in map(_range, architectures) if b.first is not None]
    lasts = [b.last for b in map(_range, architectures) if b.last is not None]
    return table.BranchRange(max(firsts) if firsts else None, min(lasts) if lasts else None)


def describe_range(bounds: table.BranchRange) -> str:
    """Branches in words: `branch 525 or newer`, `branch 470 or older`, `branches 525 to 580`."""
    if bounds.first is not None and bounds.last is not None:
        return f"branches {bounds.first} to {bounds.last}"
    if bounds.first is not None:
        return f"branch {bounds.first} or newer"
    if bounds.last is not None:
        return f"branch {bounds.last} or older"
    return "any branch"


def node_architectures(node: NodeInfo) -> list[str]:
    """The distinct architectures of the node's GPUs, in a stable order."""
    return sorted({gpu.architecture for gpu in node.gpus})


def unsupported_architectures(version: str, architectures: Iterable[str]) -> list[str]:
    """The architectures among these that the driver's branch cannot drive."""
    branch = driver_branch(version)
    return sorted({arch for arch in architectures if not branch_supports(branch, arch)})


def filter_versions(versions: Iterable[str], architectures: Iterable[str]) -> list[str]:
    """The versions (or branches) that drive every architecture, in their given order;
    entries that are not driver versions are dropped."""
    wanted = sorted(set(architectures))
    kept = []
    for version in versions:
        try:
            branch = driver_branch(version)
        except MalformedVersionError:
            continue
        if all(branch_supports(branch, arch) for arch in wanted):
            kept.append(version)
    return kept


def check_driver_for_gpus(version: str, architectures: Iterable[str], *,
                          candidates: Iterable[str] = (), named: str = "") -> None:
    """Refuse a driver that cannot drive every GPU, naming the versions that would work
    (`candidates`, oldest first: the newest few that fit are offered)."""
    archs = sorted(set(architectures))
    bad = unsupported_architectures(version, archs)
    if not bad:
        return
    needs = "; ".join(f"{arch} needs {describe_range(_range(arch))}" for arch in bad)
    message = (f"driver {version}{named} (branch {driver_branch(version)}) does not support "
               f"the {', '.join(bad)} GPU(s) on this node ({needs})")
    bounds = supported_range(archs)
    if bounds.first is not None and bounds.last is not None and bounds.first > bounds.last:
        raise DriverUnsupportedGpuError(message, remedy=(
            f"no single driver branch drives {', '.join(archs)} together: "
            "put these GPU generations on different nodes"))
    working = filter_versions(candidates, archs)
    offer = ", ".join(working[-5:]) if working else f"a driver of {describe_range(bounds)}"
    raise DriverUnsupportedGpuError(message, remedy=f"set --driver-version to {offer}")


def flavours_for(architectures: Iterable[str], version: str | None = None) -> tuple[str, ...]:
    """The kernel-module flavours that drive every architecture (with this driver, if given)."""
    archs = set(architectures)
    options: tuple[str, ...] = ("open", "proprietary")
    for arch in archs:
        allowed = ARCHITECTURES.get(arch, ARCHITECTURES["unknown"]).flavours
        options = tuple(f for f in options if f in allowed)
    if version is not None and driver_branch(version) < table.OPEN_FLAVOUR_FIRST_BRANCH:
        options = tuple(f for f in options if f != "open")
    return options


def pick_flavour(requested: str, architectures: Iterable[str],
                 version: str | None = None) -> str:
    """The flavour to install: the requested one if every GPU takes it; for `auto`, the only
    one that works, else open where a GPU prefers it (gpus.ARCHITECTURES), else proprietary."""
    archs = sorted(set(architectures))
    options = flavours_for(archs, version)
    if requested != "auto":
        if requested not in options:
            raise FlavourUnsupportedError(
                _flavour_problem(requested, archs, version),
                remedy=(f"use --flavour {options[0]} (or auto)" if options
                        else "put these GPU generations on different nodes"))
        return requested
    if not options:
        raise FlavourUnsupportedError(
            f"no kernel module flavour drives {', '.join(archs)} together"
            + (f" with driver {version}" if version else ""),
            remedy="put these GPU generations on different nodes, or pick a newer driver")
    if len(options) == 1:
        return options[0]
    prefers_open = any(ARCHITECTURES.get(a, ARCHITECTURES["unknown"]).preferred_flavour == "open"
                       for a in archs)
    return "open" if prefers_open else "proprietary"


def _flavour_problem(requested: str, archs: list[str], version: str | None) -> str:
    refusing = [a for a in archs
                if requested not in ARCHITECTURES.get(a, ARCHITECTURES["unknown"]).flavours]
    if refusing:
        return (f"the {requested} kernel modules do not support the {', '.join(refusing)} "
                "GPU(s) on this node")
    return (f"driver {version} predates the open kernel modules (first in branch "
            f"{table.OPEN_FLAVOUR_FIRST_BRANCH})")


# ---- resolution hook ------------------------------------------------------------------------

class Offer(Protocol):
    """What resolution offers: a package's driver version and flavour (repository.Candidate)."""

    @property
    def driver_version(self) -> str: ...

    @property
    def flavour(self) -> str: ...


def guard(requested: str, flavour: str, node: NodeInfo, offers: Iterable[Offer],
          aliases: Mapping[str, str] | None = None) -> Callable[[Offer], bool]:
    """Resolution's compatibility hook, run before any download: refuse (exit 14) a requested
    version, branch or alias target or a flavour that cannot drive the node's GPUs, naming
    offered versions that would; return the filter that keeps `default`/`latest` and `auto`
    away from such packages."""
    archs = node_architectures(node)
    offered = sorted({o.driver_version for o in offers if _DRIVER_RE.match(o.driver_version)},
                     key=_numbers)
    target = (aliases or {}).get(requested, requested)
    version = target if _DRIVER_RE.match(target) or _BRANCH_RE.match(target) else None
    if version is not None:
        named = f" (the sources' `{requested}`)" if target != requested else ""
        check_driver_for_gpus(version, archs, candidates=offered, named=named)
    if flavour != "auto":
        pick_flavour(flavour, archs, version)

    def allowed(offer: Offer) -> bool:
        try:
            return (not unsupported_architectures(offer.driver_version, archs)
                    and offer.flavour in flavours_for(archs, offer.driver_version))
        except MalformedVersionError:
            return False

    return allowed
