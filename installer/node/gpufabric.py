"""Each GPU's NVLink fabric state as NVML reports it: the readiness rule on a fabric node,
for the agent's rounds and for `signal`, which publishes nothing before the fabric is done.

On a fabric node CUDA fails with CUDA_ERROR_SYSTEM_NOT_READY (802) until Fabric Manager has
trained the fabric, while NVML itself looks healthy; only this state tells. NVML must
already be initialised (and bound to the staged library) by the caller; NVML errors are
raised as `pynvml.NVMLError`, for the caller to decide.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, field

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
    pci: str = field(default="", compare=False)  # 0000:07:00.0 ("" when NVML cannot say)

    @property
    def ok(self) -> bool:
        """Usable by CUDA on its own: completed with success, or no fabric at all (see
        `not_done` for a GPU without fabric info among GPUs that have it)."""
        return self.state == NOT_SUPPORTED or (self.state == COMPLETED and self.status == 0)

    @property
    def shown_state(self) -> str:
        return FAILED if self.state == COMPLETED and self.status else self.state

    def text(self) -> str:
        where = f" ({self.pci})" if self.pci else ""
        if self.state == COMPLETED and self.status:
            return f"GPU {self.index}{where}: completed with NVML error {self.status}"
        return f"GPU {self.index}{where}: {self.state}"


def not_done(gpus: list[GpuFabric]) -> list[GpuFabric]:
    """The GPUs CUDA cannot use yet. A GPU answering NOT_SUPPORTED while others report a
    fabric is one of them: on a fabric node it is a GPU NVML cannot vouch for."""
    fabric = any(g.state != NOT_SUPPORTED for g in gpus)
    return [g for g in gpus if not g.ok or (fabric and g.state == NOT_SUPPORTED)]


def fabric_done(gpus: list[GpuFabric]) -> bool:
    """Every GPU's fabric completed with success (no GPUs: not done)."""
    return bool(gpus) and not not_done(gpus)


def not_done_detail(gpus: list[GpuFabric]) -> str:
    """Which GPUs are not done, by PCI address and state: "0000:07:00.0 not-started, ..."."""
    return ", ".join(f"{g.pci or f'GPU {g.index}'} {g.shown_state}"
                     + (f" (NVML error {g.status})" if g.state == COMPLETED and g.status
                        else "")
                     for g in not_done(gpus))


def read_fabric() -> list[GpuFabric]:
    """Every GPU's fabric state, through nvmlDeviceGetGpuFabricInfoV (the older
    nvmlDeviceGetGpuFabricInfo where the library lacks it)."""
    count = pynvml.nvmlDeviceGetCount()
    return [_read_one(index, pynvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(count)]


def _read_one(index: int, handle: object) -> GpuFabric:
    pci = _bus_id(handle)
    try:
        state, status = _query(handle)
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise
        return GpuFabric(index, NOT_SUPPORTED, None, pci)
    name = STATES.get(state, f"unknown-{state}")
    return GpuFabric(index, name, status if name == COMPLETED else None, pci)


def _bus_id(handle: object) -> str:
    """The GPU's PCI address for messages; "" when NVML cannot say (never fatal)."""
    try:
        bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    except pynvml.NVMLError:
        return ""
    text = bus.decode(errors="replace") if isinstance(bus, bytes) else str(bus)
    text = text.strip("\x00").strip()[:32]
    domain, sep, rest = text.partition(":")
    return f"{domain[-4:]}:{rest}".lower() if sep and len(domain) == 8 else text


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
    counts = Counter(g.shown_state for g in gpus)
    order = [COMPLETED, FAILED, "in-progress", "not-started", NOT_SUPPORTED]
    names = sorted(counts, key=lambda s: (order.index(s) if s in order else len(order), s))
    noun = "GPU" if len(gpus) == 1 else "GPUs"
    return f"{len(gpus)} {noun}: " + ", ".join(f"{counts[s]} {s}" for s in names)
