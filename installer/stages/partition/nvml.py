"""MIG through the real pynvml: read each GPU's layout, apply a change. No nvidia-smi.

The caller holds NVML initialised (nvmlInit ... nvmlShutdown) around these calls.
"""

from __future__ import annotations

from installer.stages.partition.plan import GpuChange, GpuNow


def read_gpus() -> list[GpuNow]:
    """Every GPU with its MIG mode (current, pending) and its instances by profile."""
    raise NotImplementedError


def apply(change: GpuChange) -> bool:
    """Make one GPU as wanted; True: the GPU needs a reset before the new mode holds."""
    raise NotImplementedError
