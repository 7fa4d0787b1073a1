"""A MIG model from the GPU's own answer (NVML), as mig-parted plans since 2026-02.

mig-parted generates its configs from the profiles NVML reports and uses its static file
only when none are discovered (NVIDIA/mig-parted pkg/mig/discovery/discovery.go, commits
6ef7bf0e "dynamic MIG config generation" and 219e780d "Fallback to static MIG config when
profiles are not discovered": drivers such as R535 answer no profile while MIG mode is
off). A profile is named as go-nvlib names it (vendor/github.com/NVIDIA/go-nvlib/pkg/nvlib/
device/mig_profile.go @ mig-parted bd7160f4: `NewMigProfile`, `getMigMemorySizeGB`); the
table (`installer.compat.mig`) gives the model's name, PCI ids and reset rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from installer.compat.mig import MigModel, MigProfile

# NVML_GPU_INSTANCE_PROFILE_* -> go-nvlib's attribute suffix (+me, +me.all, +gfx, -me)
_SUFFIX = {0x7: "+me", 0x8: "+me", 0xF: "+me.all", 0x10: "+me.all", 0xA: "+gfx",
           0xB: "+gfx", 0xC: "+gfx", 0x11: "+gfx", 0xD: "-me", 0xE: "-me"}
# The full compute instance of a GPU instance, by compute slices:
# NVML_COMPUTE_INSTANCE_PROFILE_1/2/3/4/7/8/6_SLICE (nvml.h, go-nvml as vendored at bd7160f4)
_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
GIB = 1 << 30


@dataclass(frozen=True)
class NvmlProfile:
    """One GPU-instance profile as nvmlDeviceGetGpuInstanceProfileInfoV and
    nvmlDeviceGetGpuInstancePossiblePlacements_v2 answer it."""

    constant: int  # NVML_GPU_INSTANCE_PROFILE_* asked for
    slices: int  # sliceCount
    count: int  # instanceCount: how many fit one GPU
    memory_mb: int  # memorySizeMB
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slots


def memory_gb(device_bytes: int, memory_mb: int) -> int:
    """The GB in the profile's name: go-nvlib's `getMigMemorySizeGB` (the share of the
    device's memory rounded up to eighths, times the device's whole GiB, rounded)."""
    share = math.ceil(memory_mb * (1 << 20) / device_bytes * 8) / 8
    return math.floor(share * ((device_bytes + GIB - 1) // GIB) + 0.5)  # Go's math.Round


def profile_name(found: NvmlProfile, device_bytes: int) -> str:
    """`<slices>g.<GB>gb<suffix>`, as go-nvlib prints a GPU-instance profile."""
    return (f"{found.slices}g.{memory_gb(device_bytes, found.memory_mb)}gb"
            f"{_SUFFIX.get(found.constant, '')}")


def from_nvml(gpu_name: str, device_bytes: int, found: list[NvmlProfile],
              table: MigModel | None) -> MigModel | None:
    """The model NVML describes; None when it answered no usable profile (MIG off on an
    older driver, or no MIG): the caller plans from the table then."""
    profiles: dict[str, MigProfile] = {}
    slots = 0
    for p in sorted(found, key=lambda p: (p.slices, p.constant)):
        if not p.count or not p.placements or p.slices not in _CI_PROFILE:
            continue
        name = profile_name(p, device_bytes)
        size = p.placements[0][1]
        slots = max(slots, *(start + s for start, s in p.placements))
        profiles[name] = MigProfile(name, p.constant, _CI_PROFILE[p.slices], p.slices,
                                    float(memory_gb(device_bytes, p.memory_mb)), p.count,
                                    tuple(start for start, _ in p.placements), size)
    if not profiles:
        return None
    model = MigModel(gpu_name, profiles, table.needs_reset if table else False, ("NVML",),
                     slots, table.pci_ids if table else ())
    if table is not None and not differences(model, table):  # the table's model: its name
        return MigModel(table.name, profiles, table.needs_reset, ("NVML",), slots,
                        table.pci_ids)
    return model


def _shape(p: MigProfile) -> tuple[int, int, int, tuple[int, ...], int]:
    return p.gi_profile, p.slices, p.max_count, p.placements, p.size


def differences(nvml: MigModel, table: MigModel | None) -> list[str]:
    """Where NVML's answer and the table disagree, in words (empty: they agree)."""
    if table is None:
        return [f"the table has no MIG model for this GPU; NVML offers {nvml.offers()}"]
    found = []
    for name in sorted(set(nvml.profiles) | set(table.profiles)):
        ours, theirs = table.profiles.get(name), nvml.profiles.get(name)
        if ours is None:
            found.append(f"{name} only from NVML")
        elif theirs is None:
            found.append(f"{name} only in the table")
        elif _shape(ours) != _shape(theirs):
            found.append(f"{name}: NVML x{theirs.max_count} at {list(theirs.placements)}, "
                         f"the table x{ours.max_count} at {list(ours.placements)}")
    return found
