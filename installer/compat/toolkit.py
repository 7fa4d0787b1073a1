"""Which driver runs which CUDA toolkit and drives which GPU: the rules over compat_table's facts.

A CUDA toolkit needs only a *minimum* driver (newer drivers run older toolkits, and minor
version compatibility stretches that within a major version), while each GPU generation is
driven only by a range of driver branches and by some kernel-module flavours. Resolution,
`status` and the `compat` command all ask these questions here, so they never disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from installer.compat import table
from installer.errors import ConfigError, IncompatibleError

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


def run_check(cuda: str, driver: str | None,
              loaded_version: Callable[[], str | None]) -> CudaVerdict:
    """The `compat` command: against --driver, else against the driver the node has loaded
    (`loaded_version` reads the node only when asked, so `--driver` needs no host mounts)."""
    parse_cuda(cuda)
    if driver is None:
        driver = loaded_version()
        if driver is None:
            raise NoLoadedDriverError("no NVIDIA driver is loaded on this node",
                                      remedy="pass --driver VERSION to check a driver by number")
    return check_cuda(cuda, driver)
