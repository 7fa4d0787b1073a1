"""NVIDIA's data center driver branches as data: each branch's type and end of life, and the
findings `preflight` reports for a GPU and a driver (unsupported: error; past or near its
end of life: warning).

Sources (read 2026-12-05; re-check them when adding a row):
- NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit Versions", table "CUDA and
  Drivers" (https://docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-
  toolkit-versions.html, the v580 edition, last updated 2025-08-04): R535 Long Term Support
  Branch, end of life June 2026; R570 Production Branch, February 2026; R580 Long Term Support
  Branch, August 2028; and "all other previous driver branches not listed (such as R575,
  R565, R560, R550, R525, R515, R510, R495, R465, R460, R455, R450, R440, R418, R410) are end
  of life". Those carry no month: their row says "listed as ended" on that edition's date.
- The same page's later editions (.../drivers/615/... and .../drivers/620/...): R580 Long
  Term Support Branch, June 2028 (moved from August 2028); R595 Production Branch, March
  2027; R610 New Feature Branch, August 2026; R620 Long Term Support Branch, September 2029.
  New Feature Branches other than R610 have no date ("short-lived and do not have an
  end-of-life date").
- "Driver Lifecycle" (https://docs.nvidia.com/datacenter/tesla/drivers/driver-lifecycle.html):
  the three branch types (New Feature, Production: up to 1 year, LTSB: 3 years). R470's row
  (Long Term Support Branch, end of life July 2024) is from the R470-era edition of the
  support table (https://docs.nvidia.com/datacenter/tesla/drivers/, updated for R470 on
  2021-07-21); R525 and R550 were Production Branches, R560, R565, R575, R590 New Feature
  Branches (the same tables' designations).
Which GPU each branch drives (Blackwell open modules only, from R570; R580 the last branch
for Maxwell, Pascal and Volta) is not repeated here: `gpusupport` and `table` hold it.
"""

from __future__ import annotations

import calendar
import datetime
from collections.abc import Iterable
from dataclasses import dataclass

from installer.compat import gpusupport
from installer.compat.toolkit import MalformedVersionError, driver_branch

LTSB = "Long Term Support Branch"
PB = "Production Branch"
NFB = "New Feature Branch"
WARN_DAYS = 90  # an end of life this close is a warning before it passes
LISTED_ENDED = datetime.date(2025, 8, 4)  # the edition that lists branches as ended, undated


@dataclass(frozen=True)
class Branch:
    """One driver branch: its type and its last supported day (None: no date published)."""

    number: int
    kind: str
    eol: datetime.date | None
    dated: bool = True  # False: only known to have ended by `eol` (listed as ended)

    def eol_text(self) -> str:
        if self.eol is None:
            return "no end-of-life date published"
        if not self.dated:
            return f"listed as ended on {self.eol.isoformat()}"
        return f"end of life {self.eol.strftime('%B %Y')}"


def _month_end(year: int, month: int) -> datetime.date:
    return datetime.date(year, month, calendar.monthrange(year, month)[1])


def _ended(number: int, kind: str) -> Branch:
    return Branch(number, kind, LISTED_ENDED, dated=False)


BRANCHES: dict[int, Branch] = {b.number: b for b in (
    Branch(470, LTSB, _month_end(2024, 7)),
    _ended(525, PB),
    Branch(535, LTSB, _month_end(2026, 6)),
    _ended(550, PB),
    _ended(560, NFB),
    _ended(565, NFB),
    Branch(570, PB, _month_end(2026, 2)),
    _ended(575, NFB),
    Branch(580, LTSB, _month_end(2028, 6)),
    Branch(590, NFB, None),
    Branch(595, PB, _month_end(2027, 3)),
    Branch(610, NFB, _month_end(2026, 8)),
    Branch(620, LTSB, _month_end(2029, 9)),
)}


@dataclass(frozen=True)
class Finding:
    """One verdict on a driver for a GPU: `error` (it cannot serve) or `warning`."""

    level: str
    code: str  # unsupported-gpu, unsupported-flavour, past-eol, eol-soon
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"level": self.level, "code": self.code, "message": self.message}


def branch(version: str) -> Branch | None:
    """The lifecycle row of a version's (or bare branch's) branch; None when not listed."""
    try:
        return BRANCHES.get(driver_branch(version))
    except MalformedVersionError:
        return None


def findings(version: str, flavour: str, architectures: Iterable[str],
             today: datetime.date) -> list[Finding]:
    """Errors when the driver's branch or flavour cannot drive a GPU (gpusupport's rules),
    warnings when its branch is past its end of life or within WARN_DAYS of it."""
    archs = sorted(set(architectures) - {"unknown"})
    found = _support(version, flavour, archs)
    row = branch(version)
    if row is None or row.eol is None:
        return found
    name = f"R{row.number} ({row.kind})"
    if row.eol < today:
        found.append(Finding("warning", "past-eol", f"driver {version}: {name} is past its "
                             f"end of life ({row.eol_text()}): no more security fixes"))
    elif (row.eol - today).days <= WARN_DAYS:
        found.append(Finding("warning", "eol-soon", f"driver {version}: {name} reaches its "
                             f"end of life in {(row.eol - today).days} days "
                             f"({row.eol_text()})"))
    return found


def _support(version: str, flavour: str, archs: list[str]) -> list[Finding]:
    if not archs:
        return []
    try:
        bad = gpusupport.unsupported_architectures(version, archs)
        flavours = gpusupport.flavours_for(archs, version)
    except MalformedVersionError:
        return []
    found = []
    if bad:
        needs = "; ".join(f"{a} needs {gpusupport.describe_range(gpusupport.supported_range([a]))}"
                          for a in bad)
        found.append(Finding("error", "unsupported-gpu", f"driver {version} (branch "
                             f"{driver_branch(version)}) does not drive {', '.join(bad)} "
                             f"GPUs ({needs})"))
    if flavour in ("open", "proprietary") and flavour not in flavours:
        takes = "/".join(flavours) or "no flavour of this driver"
        found.append(Finding("error", "unsupported-flavour", f"the {flavour} kernel modules "
                             f"of driver {version} do not drive {', '.join(archs)} GPUs "
                             f"(they take {takes})"))
    return found
