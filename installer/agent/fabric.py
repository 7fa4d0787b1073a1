"""Each GPU's NVLink fabric state as NVML reports it: the agent's readiness rule.

On a fabric node CUDA fails with CUDA_ERROR_SYSTEM_NOT_READY (802) until Fabric Manager has
trained the fabric, while NVML itself looks healthy; only this state tells. NVML must
already be initialised (and bound to the staged library) by the caller; NVML errors are
raised as `pynvml.NVMLError`, for the caller to decide.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass

import pynvml  # type: ignore[import-untyped]

# NVML's nvmlGpuFabricState_t, in order.
STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
NOT_SUPPORTED = "not-supported"
COMPLETED = "completed"
FAILED = "completed-with-error"  # completed, but NVML's status is an error


@dataclass(frozen=True)
class GpuFabric:
    """One GPU's fabric: `state` one of STATES' names; `status` is NVML's result of the
    fabric registration, meaningful (and set) only once completed."""

    index: int
    state: str
    status: int | None

    @property
    def ok(self) -> bool:
        """Usable by CUDA: completed with success, or a GPU without a fabric at all."""
        return self.state == NOT_SUPPORTED or (self.state == COMPLETED and self.status == 0)

    def text(self) -> str:
        if self.state == COMPLETED and self.status:
            return f"GPU {self.index}: completed with NVML error {self.status}"
        return f"GPU {self.index}: {self.state}"


def read_fabric() -> list[GpuFabric]:
    """Every GPU's fabric state, through nvmlDeviceGetGpuFabricInfoV (the older
    nvmlDeviceGetGpuFabricInfo where the library lacks it)."""
    count = pynvml.nvmlDeviceGetCount()
    return [_read_one(index, pynvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(count)]


def _read_one(index: int, handle: object) -> GpuFabric:
    try:
        state, status = _query(handle)
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise
        return GpuFabric(index, NOT_SUPPORTED, None)
    name = STATES.get(state, f"unknown-{state}")
    return GpuFabric(index, name, status if name == COMPLETED else None)


def _query(handle: object) -> tuple[int, int]:
    """(state, status), from the versioned call when the library has it."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    try:
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        legacy = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(legacy))
        return int(legacy.state), int(legacy.status)
    return int(info.state), int(info.status)


def fabric_summary(gpus: list[GpuFabric]) -> str:
    """One line for logs, Events and `status`: "8 GPUs: 6 completed, 2 in-progress"."""
    if not gpus:
        return "no GPUs"
    counts = Counter(FAILED if g.state == COMPLETED and not g.ok else g.state for g in gpus)
    order = [COMPLETED, FAILED, "in-progress", "not-started", NOT_SUPPORTED]
    names = sorted(counts, key=lambda s: (order.index(s) if s in order else len(order), s))
    noun = "GPU" if len(gpus) == 1 else "GPUs"
    return f"{len(gpus)} {noun}: " + ", ".join(f"{counts[s]} {s}" for s in names)
