"""MIG profiles per GPU model as data: what sizes a GPU offers, their NVML ids and placements.

The partition stage validates a wanted layout against this table before touching a GPU, and
places each instance where NVML will accept it (`MigModel.pack`), so a layout that fits on
paper also fits on the GPU.

Sources (re-check them when adding a model):
- Profiles, their fractions, instance counts and placement diagrams: NVIDIA's MIG User Guide,
  "Supported MIG Profiles" (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/
  supported-mig-profiles.html; A100 table and figure, with the note that A100-80GB names
  scale by memory) and "Supported GPUs" (which products have MIG, 7 instances at most).
- Profile names per product: NVIDIA/mig-parted's deployments/systemd/config-default.yaml
  (`all-1g.*`, `all-balanced` and friends with their device filters: A100-40GB, A100/H100-80GB,
  H100 NVL 94GB, H200 141GB, B200, GB200), which names the sizes each product offers.
- Profile ids: NVML's nvml.h, `NVML_GPU_INSTANCE_PROFILE_*` (1_SLICE 0x0, 2_SLICE 0x1, 3_SLICE
  0x2, 4_SLICE 0x3, 7_SLICE 0x4, 1_SLICE_REV1 0x7 (+me), 1_SLICE_REV2 0x9 (double memory)) and
  `NVML_COMPUTE_INSTANCE_PROFILE_*` (1, 2, 3, 4, 7 slices: 0x0 to 0x4), as pynvml exports them.
- Placements (8 memory slots, 7 compute slices): the guide's placement figure, as
  `nvidia-smi mig -lgipp` prints it: 1g `{0..6}:1`, 1g+me `{0..6}:1`, 1g double memory
  `{0,2,4,6}:2`, 2g `{0,2,4}:2`, 3g `{0,4}:4`, 4g `{0}:4`, 7g `{0}:8`; the same shapes on
  Hopper and Blackwell (the guide's H100 section).
- Mode change: on Ampere (A100) MIG mode stays pending until a GPU reset; from Hopper on the
  mode takes effect without one (the guide's "Enable MIG Mode" section).
- Not in mig-parted's list, so left out: GB200's `+me` size; GH200/H100-96GB and A30 (other
  names and a 4-slice A30), RTX PRO Blackwell (4 slices, graphics profiles).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SLOTS = 8  # memory slots a placement is counted in
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance size as NVIDIA names it, with the NVML ids that create it."""

    name: str  # "1g.10gb"
    gi_profile: int  # NVML_GPU_INSTANCE_PROFILE_* id
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* id (the full-GI compute instance)
    slices: int  # compute slices it takes of 7
    memory_gib: float  # as its name says (NVIDIA rounds it)
    max_count: int  # how many fit on one GPU
    placements: tuple[int, ...] = ()  # memory-slot starts NVML accepts (of 8 slots)
    size: int = 1  # memory slots one instance occupies


@dataclass(frozen=True)
class _Shape:
    """A profile's shape, the same on every 7-slice model here; only the memory differs."""

    suffix: str  # appended to the size's name ("+me")
    gi_profile: int
    ci_profile: int
    slices: int
    size: int
    placements: tuple[int, ...]
    max_count: int


# The 1g, 1g+me, 1g double-memory, 2g, 3g, 4g and 7g shapes (sources: the module docstring).
_ONE = _Shape("", 0x0, 0x0, 1, 1, tuple(range(7)), 7)
_ONE_ME = _Shape("+me", 0x7, 0x0, 1, 1, tuple(range(7)), 1)
_ONE_DOUBLE = _Shape("", 0x9, 0x0, 1, 2, (0, 2, 4, 6), 4)
_TWO = _Shape("", 0x1, 0x1, 2, 2, (0, 2, 4), 3)
_THREE = _Shape("", 0x2, 0x2, 3, 4, (0, 4), 2)
_FOUR = _Shape("", 0x3, 0x3, 4, 4, (0,), 1)
_SEVEN = _Shape("", 0x4, 0x4, 7, 8, (0,), 1)


@dataclass(frozen=True)
class MigModel:
    """A GPU model that has MIG: its profiles by name and how a mode change takes effect."""

    name: str
    profiles: dict[str, MigProfile] = field(hash=False)
    needs_reset: bool  # A100: a mode change stays pending until a GPU reset
    sources: tuple[str, ...] = ()

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
        size, too many of one, more than 7 compute slices, or no placements that fit)."""
        fixed = list(fixed)
        wanted = dict(devices)
        for name, _start in fixed:
            wanted[name] = wanted.get(name, 0) - 1
        if any(name not in self.profiles or count < 0 for name, count in wanted.items()):
            return None
        totals = dict(devices)
        if any(count > self.profiles[name].max_count for name, count in totals.items()):
            return None
        if sum(self.profiles[n].slices * c for n, c in totals.items()) > COMPUTE_SLICES:
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


def _model(name: str, sizes: tuple[int, int, int, int, int, int], *, me: bool,
           needs_reset: bool, sources: tuple[str, ...]) -> MigModel:
    """A model from its sizes' memory (1g, 1g double, 2g, 3g, 4g, 7g, in GB as named)."""
    one, one_double, two, three, four, seven = sizes
    rows = [("1g", one, _ONE)] + ([("1g", one, _ONE_ME)] if me else []) + [
        ("1g", one_double, _ONE_DOUBLE), ("2g", two, _TWO), ("3g", three, _THREE),
        ("4g", four, _FOUR), ("7g", seven, _SEVEN)]
    profiles = {}
    for compute, memory, shape in rows:
        label = f"{compute}.{memory}gb{shape.suffix}"
        profiles[label] = MigProfile(label, shape.gi_profile, shape.ci_profile, shape.slices,
                                     float(memory), shape.max_count, shape.placements,
                                     shape.size)
    return MigModel(name, profiles, needs_reset, sources)


_GUIDE = "NVIDIA MIG User Guide, Supported MIG Profiles"
_PARTED = "NVIDIA/mig-parted deployments/systemd/config-default.yaml"

# (family pattern on the NVML name, nominal total memory in MiB, model name, the memory of its
# 1g, 1g double, 2g, 3g, 4g and 7g sizes in GB as named, whether it has a 1g+me size)
_ROWS: tuple[tuple[str, int, str, tuple[int, int, int, int, int, int], bool], ...] = (
    (r"\bA100\b", 40 * 1024, "A100-40GB", (5, 10, 10, 20, 20, 40), True),
    (r"\bA100\b", 80 * 1024, "A100-80GB", (10, 20, 20, 40, 40, 80), True),
    (r"\bH100\b", 80 * 1024, "H100-80GB", (10, 20, 20, 40, 40, 80), True),
    (r"\bH100\b", 94 * 1024, "H100-94GB", (12, 24, 24, 47, 47, 94), True),
    (r"\bH200\b", 141 * 1024, "H200-141GB", (18, 35, 35, 71, 71, 141), True),
    (r"\bB200\b", 180 * 1024, "B200", (23, 45, 45, 90, 90, 180), True),
    (r"\bGB200\b", 186 * 1024, "GB200", (24, 47, 47, 95, 95, 189), False),
)

# Only Ampere keeps a mode change pending until a reset.
MODELS: tuple[tuple[str, int, MigModel], ...] = tuple(
    (pattern, mib, _model(name, sizes, me=me, needs_reset=name.startswith("A100"),
                          sources=(_GUIDE, _PARTED)))
    for pattern, mib, name, sizes, me in _ROWS)

PROFILE_NAME = re.compile(r"^[1-7]g\.[0-9]+gb(\+me)?$")


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
    return any(name in model.profiles for _, _, model in MODELS)
