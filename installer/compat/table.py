"""NVIDIA's compatibility facts as data: CUDA toolkit minimum drivers, GPU generations' branches.

Sources (re-check them when adding a row; `compat.toolkit` holds the rules that read this):
- CUDA toolkit -> minimum Linux x86_64 driver: NVIDIA CUDA Toolkit Release Notes, section
  "CUDA Driver", table "CUDA Toolkit and Corresponding Driver Versions"
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html; rows up to 12.9 from the
  13.4 Update 1 notes' "Older CUDA versions" table, 13.0-13.2 from the 13.2 Update 2 notes).
  From CUDA 13.3 on the notes give only the driver *branch* (13.3 -> R610, 13.4 -> R615), so
  those rows carry the branch number alone: the branch's first release is the minimum.
- Minor version compatibility floors: same notes, table "Driver Range for Minor Version
  Compatibility" (11.x >= 450, 12.x >= 525, 13.x >= 580) and the note that across CUDA 11.x it
  needs 450.80.02 or later on Linux; 12.x and 13.x floors are their .0 GA minimums
  (525.60.13, 580.65.06), since no earlier release of those branches ran them.
- Driver branches per GPU architecture: NVIDIA's legacy GPU list and Unix driver README
  (R470 is the last branch for Kepler, R580 the last for Maxwell, Pascal and Volta), the data
  center driver release notes adding each generation (Turing R410, Ampere R450, Ada Lovelace
  and Hopper R525, Blackwell R570), and the open-gpu-kernel-modules README (the open flavour
  exists from R515, for Turing and newer; Grace Hopper and Blackwell need it). The Grace
  superchips (GH200, GB200, GB300) are rows of their own: see the comment at their rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolkitRelease:
    """One CUDA toolkit release and the oldest Linux x86_64 driver it needs."""

    version: str  # as NVIDIA numbers the release: "12.4.1"; before 11.0 "10.1.105"
    label: str  # as the release notes name it
    min_driver: str  # an exact version, or a bare branch ("610") when only that is published
    prerelease: bool = False


@dataclass(frozen=True)
class BranchRange:
    """The driver branches that support a GPU architecture (None: no bound known/needed)."""

    first: int | None
    last: int | None


TOOLKIT_RELEASES: tuple[ToolkitRelease, ...] = (
    ToolkitRelease("10.0.130", "CUDA 10.0.130", "410.48"),
    ToolkitRelease("10.1.105", "CUDA 10.1 (10.1.105 general release, and updates)", "418.39"),
    ToolkitRelease("10.2.89", "CUDA 10.2.89", "440.33"),
    ToolkitRelease("11.0.1", "CUDA 11.0.1 RC", "450.36.06", prerelease=True),
    ToolkitRelease("11.0.2", "CUDA 11.0.2 GA", "450.51.05"),
    ToolkitRelease("11.0.3", "CUDA 11.0.3 Update 1", "450.51.06"),
    ToolkitRelease("11.1.0", "CUDA 11.1 GA", "455.23"),
    ToolkitRelease("11.1.1", "CUDA 11.1.1 Update 1", "455.32"),
    ToolkitRelease("11.2.0", "CUDA 11.2.0 GA", "460.27.03"),
    ToolkitRelease("11.2.1", "CUDA 11.2.1 Update 1", "460.32.03"),
    ToolkitRelease("11.2.2", "CUDA 11.2.2 Update 2", "460.32.03"),
    ToolkitRelease("11.3.0", "CUDA 11.3.0 GA", "465.19.01"),
    ToolkitRelease("11.3.1", "CUDA 11.3.1 Update 1", "465.19.01"),
    ToolkitRelease("11.4.0", "CUDA 11.4.0 GA", "470.42.01"),
    ToolkitRelease("11.4.1", "CUDA 11.4 Update 1", "470.57.02"),
    ToolkitRelease("11.4.2", "CUDA 11.4 Update 2", "470.57.02"),
    ToolkitRelease("11.4.3", "CUDA 11.4 Update 3", "470.82.01"),
    ToolkitRelease("11.4.4", "CUDA 11.4 Update 4", "470.82.01"),
    ToolkitRelease("11.5.0", "CUDA 11.5 GA", "495.29.05"),
    ToolkitRelease("11.5.1", "CUDA 11.5 Update 1", "495.29.05"),
    ToolkitRelease("11.5.2", "CUDA 11.5 Update 2", "495.29.05"),
    ToolkitRelease("11.6.0", "CUDA 11.6 GA", "510.39.01"),
    ToolkitRelease("11.6.1", "CUDA 11.6 Update 1", "510.47.03"),
    ToolkitRelease("11.6.2", "CUDA 11.6 Update 2", "510.47.03"),
    ToolkitRelease("11.7.0", "CUDA 11.7 GA", "515.43.04"),
    ToolkitRelease("11.7.1", "CUDA 11.7 Update 1", "515.48.07"),
    ToolkitRelease("11.8.0", "CUDA 11.8 GA", "520.61.05"),
    ToolkitRelease("12.0.0", "CUDA 12.0 GA", "525.60.13"),
    ToolkitRelease("12.0.1", "CUDA 12.0 Update 1", "525.85.12"),
    ToolkitRelease("12.1.0", "CUDA 12.1 GA", "530.30.02"),
    ToolkitRelease("12.1.1", "CUDA 12.1 Update 1", "530.30.02"),
    ToolkitRelease("12.2.0", "CUDA 12.2 GA", "535.54.03"),
    ToolkitRelease("12.2.1", "CUDA 12.2 Update 1", "535.86.09"),
    ToolkitRelease("12.2.2", "CUDA 12.2 Update 2", "535.104.05"),
    ToolkitRelease("12.3.0", "CUDA 12.3 GA", "545.23.06"),
    ToolkitRelease("12.3.1", "CUDA 12.3 Update 1", "545.23.08"),
    ToolkitRelease("12.4.0", "CUDA 12.4 GA", "550.54.14"),
    ToolkitRelease("12.4.1", "CUDA 12.4 Update 1", "550.54.15"),
    ToolkitRelease("12.5.0", "CUDA 12.5 GA", "555.42.02"),
    ToolkitRelease("12.5.1", "CUDA 12.5 Update 1", "555.42.06"),
    ToolkitRelease("12.6.0", "CUDA 12.6 GA", "560.28.03"),
    ToolkitRelease("12.6.1", "CUDA 12.6 Update 1", "560.35.03"),
    ToolkitRelease("12.6.2", "CUDA 12.6 Update 2", "560.35.03"),
    ToolkitRelease("12.6.3", "CUDA 12.6 Update 3", "560.35.05"),
    ToolkitRelease("12.8.0", "CUDA 12.8 GA", "570.26"),
    ToolkitRelease("12.8.1", "CUDA 12.8 Update 1", "570.124.06"),
    ToolkitRelease("12.9.0", "CUDA 12.9 GA", "575.51.03"),
    ToolkitRelease("12.9.1", "CUDA 12.9 Update 1", "575.57.08"),
    ToolkitRelease("13.0.0", "CUDA 13.0 GA", "580.65.06"),
    ToolkitRelease("13.0.1", "CUDA 13.0 Update 1", "580.82.07"),
    ToolkitRelease("13.0.2", "CUDA 13.0 Update 2", "580.95.05"),
    ToolkitRelease("13.1.0", "CUDA 13.1 GA", "590.44.01"),
    ToolkitRelease("13.1.1", "CUDA 13.1 Update 1", "590.48.01"),
    ToolkitRelease("13.2.0", "CUDA 13.2 GA", "595.45.04"),
    ToolkitRelease("13.2.1", "CUDA 13.2 Update 1", "595.58.03"),
    ToolkitRelease("13.2.2", "CUDA 13.2 Update 2", "595.71.05"),
    ToolkitRelease("13.3.0", "CUDA 13.3 (driver branch R610)", "610"),
    ToolkitRelease("13.4.0", "CUDA 13.4 (driver branch R615)", "615"),
)

# CUDA major version -> the oldest driver that runs any toolkit of that major version
# through minor version compatibility (features needing a newer driver may still fail).
MINOR_VERSION_FLOORS: dict[int, str] = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}

# Keys are installer.node.gpus.ARCHITECTURES' names; "unknown" (a GPU newer than our id table)
# has no bound: refusing it would block exactly the new hardware a newer driver serves.
ARCHITECTURE_BRANCHES: dict[str, BranchRange] = {
    "Kepler": BranchRange(None, 470),
    "Maxwell": BranchRange(None, 580),
    "Pascal": BranchRange(None, 580),
    "Volta": BranchRange(None, 580),
    "Turing": BranchRange(410, None),
    "Ampere": BranchRange(450, None),
    "Ada Lovelace": BranchRange(525, None),
    "Hopper": BranchRange(525, None),
    "Blackwell": BranchRange(570, None),
    # Grace superchips, open modules only. The open-gpu-kernel-modules README's "Compatible
    # GPUs" table lists GH200 2342 in 550.40.82 (not yet 2348, GB200 2941 or GB300 31C2;
    # all four are in later ones, e.g. 610.43.03). Floors: GH200 R535 (the data center
    # branch it launched with), GB200 R570 (Blackwell's first), GB300 R580 (the first
    # production branch for Blackwell Ultra). Re-check these before lowering a floor.
    "Grace Hopper": BranchRange(535, None),
    "Grace Blackwell": BranchRange(570, None),
    "Grace Blackwell Ultra": BranchRange(580, None),
    "unknown": BranchRange(None, None),
}

# The open kernel modules were first published with the R515 branch.
OPEN_FLAVOUR_FIRST_BRANCH = 515
