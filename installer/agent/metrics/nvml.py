"""Per-GPU readings through the real pynvml, one pass per collection.

Utilisation is a duty cycle, as GKE's device plugin computes it: the mean of NVML's
utilisation samples (nvmlDeviceGetSamples, NVML_GPU_UTILIZATION_SAMPLES) newer than the
last one seen, so every sample counts once; where the GPU or driver has no samples, the
instant nvmlDeviceGetUtilizationRates, said in the log once and in `utilization_source`.
One GPU's NVML error leaves the others' readings and the rest of its own.

A GPU's name, UUID and PCI bus id label every series of it; pynvml decodes them as UTF-8
and raises UnicodeDecodeError when the hardware gave other bytes. Such a GPU is not
served (no label could name it truthfully): it is listed as unreadable, with the cause,
and every other GPU is read as usual.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from installer.agent.metrics.gpm import GpmReader
from installer.agent.metrics.snapshot import GpuReading

WINDOW_S = 10.0  # the first pass looks back this far (GKE: 10 s)
T = TypeVar("T")
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
_NO_SAMPLES = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_ABSENT = _NO_SAMPLES  # the driver lacks the call, or the GPU does not support it


@dataclass
class PassResult:
    """One pass: the GPUs read, the CUDA version, each failure as (source, message), and the
    GPUs not served as (index, cause)."""

    gpus: list[GpuReading] = field(default_factory=list)
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    cuda_version: str = ""
    driver_version: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)


class NvmlReader:
    """Reads every GPU; remembers each GPU's last utilisation sample between passes."""

    def __init__(self, log: Any, clock: Callable[[], float] = time.time,
                 gpm: GpmReader | None = None) -> None:
        self.log, self.clock, self.gpm = log, clock, gpm  # gpm None: GPM off
        self.last_seen: dict[str, int] = {}  # UUID -> last sample's timestamp (us)
        self.duty: dict[str, float] = {}  # UUID -> last duty cycle (no new samples: kept)
        self.no_samples_logged: set[str] = set()
        self.unreadable: dict[int, str] = {}  # index -> cause, said in the log once

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
        try:
            result.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except (pynvml.NVMLError, UnicodeDecodeError) as exc:
            result.failures.append(("nvml", f"nvmlSystemGetDriverVersion: {exc}"))
        for index in range(count):
            try:
                gpu, errors = self._gpu(index)
            except UnicodeDecodeError as exc:
                gpu, errors = None, [self._unreadable(index, exc)]
                result.unreadable.append((index, self.unreadable[index]))
            else:
                self.unreadable.pop(index, None)
            if gpu is not None:
                result.gpus.append(gpu)
            result.failures += [("nvml_gpu", f"GPU {index}: {e}") for e in errors[:1]]
        if self.gpm is not None and result.gpus:
            self._gpm(self.gpm, result)
        return result

    def _gpm(self, gpm: GpmReader, result: PassResult) -> None:
        """Every GPU read this pass gains its GPM reading (one wait for all of them)."""
        handles = []
        for gpu in result.gpus:
            try:
                handles.append((gpu.uuid, pynvml.nvmlDeviceGetHandleByIndex(gpu.index)))
            except pynvml.NVMLError as exc:
                result.failures.append(("gpm", f"GPU {gpu.index}: {exc}"))
        instances = {gpu.uuid: sorted(set(gpu.mig_instances.values())) for gpu in result.gpus}
        found, errors = gpm.read(handles, instances)
        result.failures += [("gpm", error) for error in errors]
        result.gpus = [replace(gpu, gpm=found.get(gpu.uuid)) for gpu in result.gpus]

    def _unreadable(self, index: int, exc: UnicodeDecodeError) -> str:
        """The cause (`name is not UTF-8`), logged once per GPU while it lasts."""
        what = exc.reason if exc.reason in _IDENTITY else "a string"
        cause = f"its NVML {what} is not UTF-8"
        if self.unreadable.get(index) != cause:
            self.log.warning("GPU not served: unreadable", gpu=index, reason=cause,
                             raw=repr(exc.object[:64]))
        self.unreadable[index] = cause
        return f"{cause}: {exc.object[:64]!r}"

    def _gpu(self, index: int) -> tuple[GpuReading | None, list[str]]:
        """One GPU's readings; UnicodeDecodeError (its `reason` naming the string) when its
        name, UUID or bus id is not UTF-8."""
        errors: list[str] = []
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _identity("UUID", lambda: pynvml.nvmlDeviceGetUUID(handle))
            name = _identity("name", lambda: pynvml.nvmlDeviceGetName(handle))
            bus = _identity("PCI bus id", lambda: pynvml.nvmlDeviceGetPciInfo(handle).busId)
        except pynvml.NVMLError as exc:
            return None, [str(exc)]

        def get(what: str, fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except pynvml.NVMLError as exc:
                errors.append(f"{what}: {exc}")
                return None

        memory = get("memory", lambda: _memory(handle))
        power = get("power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        duty = get("utilisation", lambda: self._duty_cycle(handle, uuid))
        migs = _mig_devices(handle)
        return GpuReading(
            index=index, uuid=uuid, model=name, pci_bus_id=bus,
            minor=_quiet(lambda: pynvml.nvmlDeviceGetMinorNumber(handle)),
            duty_cycle=duty,
            utilization_source="instant" if uuid in self.no_samples_logged else "samples",
            memory_used=memory.used if memory is not None else None,
            memory_total=memory.total if memory is not None else None,
            memory_free=memory.free if memory is not None else None,
            memory_reserved=memory.reserved if memory is not None else None,
            temperature=get("temperature", lambda: float(pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU))),
            power_watts=power / 1000.0 if power is not None else None,
            ecc=_ecc(handle), remapped=_remapped(handle), mig_uuids=tuple(migs),
            mig_instances={u: gi for u, gi in migs.items() if gi is not None}), errors

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


@dataclass(frozen=True)
class Memory:
    """A GPU's memory in bytes: `used` with the reserved part in it (NVML's v1 `used`, what
    GKE's plugin serves), `reserved` None where NVML has no v2 memory info."""

    total: int
    used: int
    free: int
    reserved: int | None


def _memory(handle: Any) -> Memory:
    """nvmlDeviceGetMemoryInfo_v2 (total = reserved + allocated + free), or v1 (reserved
    unknown) where the driver lacks v2 or the GPU does not support it."""
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as exc:
        if exc.value not in _ABSENT:
            raise
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return Memory(total=int(v1.total), used=int(v1.used), free=int(v1.free), reserved=None)
    return Memory(total=int(v2.total), used=int(v2.used) + int(v2.reserved),
                  free=int(v2.free), reserved=int(v2.reserved))


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


def _mig_devices(handle: Any) -> dict[str, int | None]:
    """The GPU's MIG devices (device plugins hand them to containers) by UUID, each with its
    GPU instance id (None where NVML gave none); {} with MIG off or unsupported. NVML may
    leave gaps among the indexes: each one is asked."""
    mode = _quiet(lambda: pynvml.nvmlDeviceGetMigMode(handle))
    if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return {}
    most = _quiet(lambda: int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))) or 0
    found = (_mig_device(handle, index) for index in range(most))
    return dict(device for device in found if device is not None)


def _mig_device(handle: Any, index: int) -> tuple[str, int | None] | None:
    """The MIG device at `index`: its UUID and GPU instance id; None for a gap or a UUID
    that is not UTF-8 (it names no container's device then)."""
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        uuid = pynvml.nvmlDeviceGetUUID(mig)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except (pynvml.NVMLError, UnicodeDecodeError):
        return None
    instance = _quiet(lambda: int(pynvml.nvmlDeviceGetGpuInstanceId(mig)))
    return uuid, instance


def _quiet(fn: Callable[[], T]) -> T | None:
    """An optional reading: unsupported or failing means absent, not an error."""
    try:
        return fn()
    except pynvml.NVMLError:
        return None


_IDENTITY = ("UUID", "name", "PCI bus id")


def _text(value: str | bytes) -> str:
    """NVML's string (pynvml gives str, or bytes for some calls and versions)."""
    return value.decode() if isinstance(value, bytes) else value


def _identity(what: str, read: Callable[[], str | bytes]) -> str:
    """A label string from NVML; UnicodeDecodeError whose `reason` is `what` when the bytes
    are not UTF-8 (pynvml's own decode, or ours of a struct field)."""
    try:
        value = read()
        return value.decode() if isinstance(value, bytes) else value
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(exc.encoding, exc.object, exc.start, exc.end, what) from exc
