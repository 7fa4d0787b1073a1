"""MIG profiles per GPU model: what sizes a GPU offers, their NVML ids and placements.

The partition stage validates a wanted layout against these models before touching a GPU,
and places each instance where NVML will accept it (`MigModel.pack`), so a layout that fits
on paper also fits on the GPU. The models are built from the data in
`installer.compat.migdata`, which says per model where its sizes come from (mig-parted's
config-default.yaml, GKE's partition list, NVIDIA's MIG User Guide for placements).

Mode change: on Ampere (A100, A30) MIG mode stays pending until a GPU reset; from Hopper on
the mode takes effect without one (the MIG User Guide's "Enable MIG Mode" section).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from installer.compat.migdata import ROWS, SHAPES, ModelRow

# One compute instance over a whole GPU instance, by its compute slices:
# NVML_COMPUTE_INSTANCE_PROFILE_1/2/3/4/7_SLICE (nvml.h).
_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance size as NVIDIA names it, with the NVML ids that create it."""

    name: str  # "1g.10gb"
    gi_profile: int  # NVML_GPU_INSTANCE_PROFILE_* id
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* id (the full-GI compute instance)
    slices: int  # compute slices it takes (of 7, or 4 on a 4-slice part)
    memory_gib: float  # as its name says (NVIDIA rounds it)
    max_count: int  # how many fit on one GPU
    placements: tuple[int, ...] = ()  # memory-slot starts NVML accepts
    size: int = 1  # memory slots one instance occupies


@dataclass(frozen=True)
class MigModel:
    """A GPU model that has MIG: its profiles by name and how a mode change takes effect."""

    name: str
    profiles: dict[str, MigProfile] = field(hash=False)
    needs_reset: bool  # Ampere: a mode change stays pending until a GPU reset
    sources: tuple[str, ...] = ()
    slots: int = 8  # memory slots placements count in
    pci_ids: tuple[str, ...] = ()  # 0xDDDDVVVV, as mig-parted's device filters name them

    @property
    def compute_slices(self) -> int:
        """Compute slices of the whole GPU: 7 on the 8-slot parts, 4 on the 4-slot ones."""
        return 7 if self.slots == 8 else self.slots

    def fill(self, profile: str) -> int:
        """How many instances of `profile` fit one GPU (0: the model has no such size)."""
        found = self.profiles.get(profile)
        return found.max_count if found else 0

    def by_gi_profile(self, gi_profile: int) -> MigProfile | None:
        """The profile NVML creates for this GPU-instance profile id, if the table has it."""
        return next((p for p in self.profiles.values() if p.gi_profile == gi_profile), None)

    def offers(self) -> str:
        """The sizes in words, smallest first: `1g.5gb (x7), 1g.5gb+me (x1), ...`."""
        return ", ".join(f"{p.name} (x{p.max_count})" for p in self.profiles.values())

    def pack(self, devices: Mapping[str, int], fixed: Iterable[tuple[str, int]] = ()
             ) -> list[tuple[str, int]] | None:
        """A start slot for every wanted instance, as (profile, start) pairs, keeping the
        `fixed` ones where they are; None when the layout does not fit this GPU (an unknown
        size, too many of one, more compute slices than the GPU has, or no placements)."""
        fixed = list(fixed)
        wanted = dict(devices)
        for name, _start in fixed:
            wanted[name] = wanted.get(name, 0) - 1
        if any(name not in self.profiles or count < 0 for name, count in wanted.items()):
            return None
        totals = dict(devices)
        if any(count > self.profiles[name].max_count for name, count in totals.items()):
            return None
        if sum(self.profiles[n].slices * c for n, c in totals.items()) > self.compute_slices:
            return None
        used = 0
        for name, start in fixed:
            mask = _mask(self.profiles[name], start)
            if start not in self.profiles[name].placements or used & mask:
                return None
            used |= mask
        todo = sorted((self.profiles[n] for n, c in wanted.items() for _ in range(c)),
                      key=lambda p: (-p.size, len(p.placements), p.name))
        placed = _place(todo, used, -1)
        return None if placed is None else fixed + placed


def _mask(profile: MigProfile, start: int) -> int:
    return ((1 << profile.size) - 1) << start


def _place(todo: list[MigProfile], used: int, floor: int) -> list[tuple[str, int]] | None:
    """Backtracking over placements; instances of one profile take rising starts (`floor`),
    so identical instances are not tried in every order."""
    if not todo:
        return []
    first, rest = todo[0], todo[1:]
    for start in first.placements:
        if start <= floor or used & _mask(first, start):
            continue
        next_floor = start if rest and rest[0] is first else -1
        placed = _place(rest, used | _mask(first, start), next_floor)
        if placed is not None:
            return [(first.name, start), *placed]
    return None


def _model(row: ModelRow) -> MigModel:
    """A model from its data row, each size's shape from the placement table."""
    profiles = {}
    for name, constant, count in row.profiles:
        slices, size, starts = SHAPES[(row.slots, constant)]
        memory = float(name.split(".")[1].split("gb")[0])
        profiles[name] = MigProfile(name, constant, _CI_PROFILE[slices], slices, memory,
                                    count, starts, size)
    return MigModel(row.name, profiles, row.needs_reset, row.sources, row.slots, row.pci_ids)


# (family pattern on the NVML name, nominal memory in MiB, model): a model may answer to
# several names (an H20 and a GH200 96GB have the same sizes).
MODELS: tuple[tuple[str, int, MigModel], ...] = tuple(
    (pattern, row.memory_mib, model)
    for row, model in ((row, _model(row)) for row in ROWS) for pattern in row.families)

PROFILE_NAME = re.compile(r"^[1-7]g\.[0-9]+gb(\+me|\+me\.all|-me|\+gfx)?$")


def mig_model(gpu_name: str, memory_mib: int) -> MigModel | None:
    """The MIG model of a GPU as NVML names it and sizes its memory; None: no MIG.

    The name picks the family (A100, H100, ...); the memory picks the variant nearest to it,
    since NVML reports a little less than the nominal size (40536 MiB on an A100-40GB)."""
    family = [(mib, model) for pattern, mib, model in MODELS if re.search(pattern, gpu_name)]
    if not family:
        return None
    return min(family, key=lambda row: abs(row[0] - memory_mib))[1]


def known_profile(name: str) -> bool:
    """Is this a size some model in the table offers (else: a typo, or not NVIDIA's name)?"""
    return bool(offered_by(name))


def offered_by(name: str) -> list[str]:
    """The models that offer size `name`, in the table's order (empty: none does)."""
    found: list[str] = []
    for _, _, model in MODELS:
        if name in model.profiles and model.name not in found:
            found.append(model.name)
    return found
