"""MIG profiles per GPU model as data: what sizes a GPU offers, their NVML ids and placements.

The partition stage validates a wanted layout against this table before touching a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance size as NVIDIA names it, with the NVML ids that create it."""

    name: str  # "1g.10gb"
    gi_profile: int  # NVML_GPU_INSTANCE_PROFILE_* id
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* id (the full-GI compute instance)
    slices: int  # compute slices it takes of 7
    memory_gib: float
    max_count: int  # how many fit on one GPU
    placements: tuple[int, ...] = ()  # memory-slot starts NVML accepts (of 8 slots)
    size: int = 1  # memory slots one instance occupies


@dataclass(frozen=True)
class MigModel:
    """A GPU model that has MIG: its profiles by name and how a mode change takes effect."""

    name: str
    profiles: dict[str, MigProfile] = field(hash=False)
    needs_reset: bool  # A100: a mode change stays pending until a GPU reset
    sources: tuple[str, ...] = ()

    def fill(self, profile: str) -> int:
        """How many instances of `profile` fit one GPU (0: the model has no such size)."""
        raise NotImplementedError


def mig_model(gpu_name: str, memory_mib: int) -> MigModel | None:
    """The MIG model of a GPU as NVML names it and sizes its memory; None: no MIG."""
    raise NotImplementedError
