"""Per-GPU readings through the real pynvml, one pass per collection.

Utilisation is a duty cycle, as GKE's device plugin computes it: the mean of NVML's
utilisation samples (nvmlDeviceGetSamples, NVML_GPU_UTILIZATION_SAMPLES) newer than the
last one seen, so every sample counts once; where the GPU or driver has no samples, the
instant nvmlDeviceGetUtilizationRates, said in the log once and in `utilization_source`.
One GPU's NVML error leaves the others' readings and the rest of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from installer.agent.metrics.snapshot import GpuReading

WINDOW_S = 10.0  # the first pass looks back this far (GKE: 10 s)
T = TypeVar("T")
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
_NO_SAMPLES = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@dataclass
class PassResult:
    """One pass: the GPUs read, the CUDA version, and each failure as (source, message)."""

    gpus: list[GpuReading] = field(default_factory=list)
    cuda_version: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)


class NvmlReader:
    """Reads every GPU; remembers each GPU's last utilisation sample between passes."""

    def __init__(self, log: Any, clock: Callable[[], float] = time.time) -> None:
        self.log, self.clock = log, clock
        self.last_seen: dict[str, int] = {}  # UUID -> last sample's timestamp (us)
        self.duty: dict[str, float] = {}  # UUID -> last duty cycle (no new samples: kept)
        self.no_samples_logged: set[str] = set()

    def read(self) -> PassResult:
        """Every GPU NVML lists; NVML must be initialised (the agent's `nvml_ready`)."""
        result = PassResult()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            result.failures.append(("nvml", f"nvmlDeviceGetCount: {exc}"))
            return result
        try:
            version = pynvml.nvmlSystemGetCudaDriverVersion()
            result.cuda_version = f"{version // 1000}.{version % 1000 // 10}"
        except pynvml.NVMLError as exc:
            result.failures.append(("nvml", f"nvmlSystemGetCudaDriverVersion: {exc}"))
        for index in range(count):
            gpu, errors = self._gpu(index)
            if gpu is not None:
                result.gpus.append(gpu)
            result.failures += [("nvml_gpu", f"GPU {index}: {e}") for e in errors[:1]]
        return result

    def _gpu(self, index: int) -> tuple[GpuReading | None, list[str]]:
        errors: list[str] = []
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
            bus = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        except pynvml.NVMLError as exc:
            return None, [str(exc)]

        def get(what: str, fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except pynvml.NVMLError as exc:
                errors.append(f"{what}: {exc}")
                return None

        memory = get("memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        power = get("power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        duty = get("utilisation", lambda: self._duty_cycle(handle, uuid))
        return GpuReading(
            index=index, uuid=uuid, model=name, pci_bus_id=bus,
            minor=_quiet(lambda: pynvml.nvmlDeviceGetMinorNumber(handle)),
            duty_cycle=duty,
            utilization_source="instant" if uuid in self.no_samples_logged else "samples",
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            temperature=get("temperature", lambda: float(pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU))),
            power_watts=power / 1000.0 if power is not None else None,
            ecc=_ecc(handle), remapped=_remapped(handle)), errors

    def _duty_cycle(self, handle: Any, uuid: str) -> float:
        since = self.last_seen.get(uuid) or int((self.clock() - WINDOW_S) * 1e6)
        try:
            kind, samples = pynvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:  # no sample since the last pass
                return self.duty.get(uuid, 0.0)
            if exc.value not in _NO_SAMPLES:
                raise
            if uuid not in self.no_samples_logged:
                self.no_samples_logged.add(uuid)
                self.log.info("no NVML utilisation samples: duty cycle from the instant "
                              "reading", uuid=uuid, reason=str(exc))
            return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        fresh = [s for s in samples if s.timeStamp > since]
        if not fresh:
            return self.duty.get(uuid, 0.0)
        value = _VALUE_FIELDS.get(kind, "uiVal")
        duty = sum(float(getattr(s.sampleValue, value)) for s in fresh) / len(fresh)
        self.last_seen[uuid] = max(s.timeStamp for s in fresh)
        self.duty[uuid] = duty
        return duty


def _ecc(handle: Any) -> dict[str, int]:
    """Volatile ECC counts since the driver loaded; {} where ECC is off or unsupported."""
    def count(kind: int) -> int | None:
        return _quiet(lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
            handle, kind, pynvml.NVML_VOLATILE_ECC)))

    found = {"corrected": count(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
             "uncorrected": count(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)}
    return {name: value for name, value in found.items() if value is not None}


def _remapped(handle: Any) -> dict[str, int]:
    """Remapped rows by cause (Ampere and later); {} where unsupported."""
    rows = _quiet(lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
    if rows is None:
        return {}
    corrected, uncorrected, pending, failure = rows
    return {"correctable": int(corrected), "uncorrectable": int(uncorrected),
            "pending": int(pending), "failure": int(failure)}


def _quiet(fn: Callable[[], T]) -> T | None:
    """An optional reading: unsupported or failing means absent, not an error."""
    try:
        return fn()
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
