"""The MIG plan, pure: is a wanted layout possible on these GPUs, and which GPUs differ.

Nothing here touches a GPU, so a layout is refused before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuLayout:
    """What a GPU is split into: MIG on or off and the instances by profile."""

    mig_enabled: bool
    devices: tuple[tuple[str, int], ...]  # (profile name, count), sorted by name


@dataclass(frozen=True)
class GpuNow:
    """One GPU as NVML reports it now."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    layout: GpuLayout
    mode_pending: bool  # MIG mode switched but a reset is pending (A100)


@dataclass(frozen=True)
class GpuChange:
    """One GPU whose layout differs from the wanted one."""

    gpu: GpuNow
    want: GpuLayout
    mode_change: bool


def validate(want: dict[int, GpuLayout], gpus: list[GpuNow]) -> None:
    """Refuse a layout before anything changes: MigConfigError (malformed, unknown profile)
    or MigLayoutError (this GPU cannot take it), naming the GPU and the sizes it offers."""
    raise NotImplementedError


def changes(want: dict[int, GpuLayout], gpus: list[GpuNow]) -> list[GpuChange]:
    """Only the GPUs whose layout differs from the wanted one; a GPU as wanted is untouched."""
    raise NotImplementedError
