"""Which driver branches and kernel-module flavours drive which GPU generation.

Each GPU architecture is driven only by a range of driver branches (Kepler ends with 470,
Blackwell starts at 570 and needs the open modules); resolution asks `guard` before any
download, so a node never gets a driver that cannot drive its GPUs. The facts are in
`compat_table`; CUDA toolkit rules are in `compat`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from installer.compat import table
from installer.compat.toolkit import (
    _BRANCH_RE,
    _DRIVER_RE,
    MalformedVersionError,
    _numbers,
    driver_branch,
)
from installer.errors import IncompatibleError
from installer.node.gpus import ARCHITECTURES

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo


class DriverUnsupportedGpuError(IncompatibleError):
    """The driver's branch cannot drive a GPU of this node (too old or past its last branch)."""


class FlavourUnsupportedError(IncompatibleError):
    """The kernel-module flavour cannot drive a GPU of this node."""


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
