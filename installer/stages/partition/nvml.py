"""MIG through the real pynvml: read each GPU's layout, apply a change. No nvidia-smi.

The caller holds NVML initialised (nvmlInit ... nvmlShutdown) around these calls. A change
is applied by difference: instances already of a wanted size, with their one full compute
instance, stay where they are when the rest of the layout still fits around them; every
other instance goes (compute instances first, then the GPU instance) and the missing ones
are created at placements `MigModel.pack` chose, so creation never meets a slot that an
earlier instance took. Rerunning after any interruption converges: an instance left
without its compute instance reads as incomplete and is recreated.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from installer.compat.mig import MigModel, mig_model
from installer.compat.mignvml import NvmlProfile, from_nvml
from installer.compat.nodelabels import MIG_ATTRIBUTES
from installer.errors import MigInUseError, MigLayoutError, MigNvmlError
from installer.stages.partition.plan import GpuChange, GpuNow, MigDevice, layout, model_of

T = TypeVar("T")

# NVML's answers for "no such profile here": the id is past this driver's list, or the
# GPU (or this GPU instance) does not offer it.
ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT,
          pynvml.NVML_ERROR_NOT_FOUND)
MIB = 1024 * 1024


@dataclass
class _Gi:
    """One GPU instance as NVML has it, with its compute instances' handles and profiles."""

    handle: Any
    gi_profile: int
    gi_id: int
    start: int
    name: str
    complete: bool  # exactly one compute instance, the full one
    computes: list[Any] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name if self.complete else f"{self.name} (incomplete)"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _call(where: str, what: str, fn: Callable[..., T], *args: Any) -> T:
    """One pynvml call, its failure as one line naming the GPU and the call."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise _translate(exc, where, what) from exc


def _translate(exc: pynvml.NVMLError, where: str, what: str) -> MigInUseError | MigNvmlError:
    if exc.value == pynvml.NVML_ERROR_IN_USE:
        return MigInUseError(f"{where}: NVML {what} refused, the GPU or an instance is "
                             f"in use (a process holds it)")
    return MigNvmlError(f"{where}: NVML {what} failed: {exc}")


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    """A query whose absence is an answer (a profile this GPU does not offer): None."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in ABSENT:
            return None
        raise


def read_gpus() -> list[GpuNow]:
    """Every GPU with its MIG mode (current, pending) and its instances by profile.

    An instance whose compute instances are not exactly the one full compute instance is
    counted as `<profile> (incomplete)`, so it never passes for a wanted one."""
    count = _call("NVML", "nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    return [_read(index) for index in range(count)]


def _read(index: int) -> GpuNow:
    where = f"GPU {index}"
    handle = _call(where, "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex,
                   index)
    name = _text(_call(where, "nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
    uuid = _text(_call(where, "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
    memory = _call(where, "nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
    pci = _call(where, "nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
    memory_mib = int(memory.total) // MIB
    current, pending = _mode(handle, where)
    model = discover(handle, name, memory_mib * MIB)
    counts: dict[str, int] = {}
    profiles: dict[int, str] = {}  # GI id -> profile name
    if current:
        for gi in _instances(handle, model or mig_model(name, memory_mib), where):
            counts[gi.label] = counts.get(gi.label, 0) + 1
            profiles[gi.gi_id] = gi.name
    return GpuNow(index=index, uuid=uuid, name=name, memory_mib=memory_mib,
                  pci_bus_id=_text(pci.busId), layout=layout(bool(current), counts),
                  mode_pending=current != pending,
                  mig_devices=_mig_devices(handle, where, profiles) if current else (),
                  nvml_model=model)


def discover(handle: Any, name: str, device_bytes: int) -> MigModel | None:
    """The GPU's MIG profiles as NVML answers them (nvmlDeviceGetGpuInstanceProfileInfoV
    for every profile constant, nvmlDeviceGetGpuInstancePossiblePlacements_v2 for each
    one offered); None where it answers none (no MIG, MIG off on a driver that answers
    only with MIG on, as R535 does, a driver without these calls): the table plans then.
    An A30 is planned from the table as mig-parted does, since NVML misreports its counts
    (pkg/mig/discovery/discovery.go @ bd7160f4, deviceIDA30)."""
    table = mig_model(name, device_bytes // MIB)
    if table is not None and table.name.startswith("A30"):
        return None
    found = []
    try:
        for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = _optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, constant)
            if info is None or not info.instanceCount:
                continue
            found.append(NvmlProfile(constant, int(info.sliceCount), int(info.instanceCount),
                                     int(info.memorySizeMB), _placements(handle, info.id)))
    except pynvml.NVMLError:  # an older driver without the call, no permission: the table
        return None
    return from_nvml(name, device_bytes, found, table)


def _placements(handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    """Every (start, size) NVML accepts for the profile: asked for the count first (a
    NULL array), then filled."""
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None,
                                                      ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array,
                                                      ctypes.byref(count))
    return tuple((int(array[i].start), int(array[i].size)) for i in range(count.value))


# nvmlDeviceAttributes_t's fields in the order of GFD's names (nodelabels.MIG_ATTRIBUTES)
_FIELDS = ("memorySizeMB", "multiprocessorCount", "gpuInstanceSliceCount",
           "computeInstanceSliceCount", "sharedCopyEngineCount", "sharedDecoderCount",
           "sharedEncoderCount", "sharedJpegCount", "sharedOfaCount")
_ATTRIBUTES = tuple(zip(MIG_ATTRIBUTES, _FIELDS, strict=True))


def _attributes(mig: Any, where: str) -> tuple[tuple[str, int], ...]:
    """A MIG device's figures as NVML gives them (nvmlDeviceGetAttributes, what GFD labels);
    () where this driver does not answer."""
    found = _call(where, "nvmlDeviceGetAttributes", _optional,
                  pynvml.nvmlDeviceGetAttributes, mig)
    return () if found is None else tuple((k, int(getattr(found, f))) for k, f in _ATTRIBUTES)


def _mig_devices(handle: Any, where: str, profiles: dict[int, str]
                 ) -> tuple[MigDevice, ...]:
    """The GPU's MIG devices by NVML's MIG index, as nvidia-ctk enumerates them: every index
    below the maximum, an unused one answering NOT_FOUND."""
    most = _call(where, "nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount,
                 handle)
    found = []
    for index in range(int(most)):
        mig = _call(where, "nvmlDeviceGetMigDeviceHandleByIndex", _optional,
                    pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)
        if mig is None:
            continue
        gi = int(_call(where, "nvmlDeviceGetGpuInstanceId",
                       pynvml.nvmlDeviceGetGpuInstanceId, mig))
        found.append(MigDevice(
            index, _text(_call(where, "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig)),
            gi, int(_call(where, "nvmlDeviceGetComputeInstanceId",
                          pynvml.nvmlDeviceGetComputeInstanceId, mig)),
            profiles.get(gi, ""), _attributes(mig, where)))
    return tuple(found)


def _mode(handle: Any, where: str) -> tuple[int, int]:
    """(current, pending) MIG mode; (0, 0) on a GPU without MIG."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return 0, 0
        raise _translate(exc, where, "nvmlDeviceGetMigMode") from exc
    return int(current), int(pending)


def _instances(handle: Any, model: MigModel | None, where: str) -> list[_Gi]:
    """Every GPU instance of every profile NVML knows, in placement order."""
    found = []
    for gi_profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _call(where, "nvmlDeviceGetGpuInstanceProfileInfo", _optional,
                     pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, gi_profile)
        if info is None or not info.instanceCount:
            continue
        array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        _call(where, "nvmlDeviceGetGpuInstances", pynvml.nvmlDeviceGetGpuInstances,
              handle, info.id, array, ctypes.byref(count))
        profile = model.by_gi_profile(gi_profile) if model else None
        name = profile.name if profile else f"profile-{gi_profile}"
        for slot in range(count.value):
            gi = array[slot]
            placed = _call(where, "nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
            computes = _computes(gi, where)
            complete = (profile is not None and len(computes) == 1
                        and computes[0][1] == profile.ci_profile)
            found.append(_Gi(gi, gi_profile, int(placed.id), int(placed.placement.start),
                             name, complete, [handle for handle, _ in computes]))
    return sorted(found, key=lambda gi: gi.start)


def _computes(gi: Any, where: str) -> list[tuple[Any, int]]:
    """The GPU instance's compute instances as (handle, NVML compute-profile id)."""
    found: list[tuple[Any, int]] = []
    for ci_profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _call(where, "nvmlGpuInstanceGetComputeInstanceProfileInfo", _optional,
                     pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_profile,
                     pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        if info is None or not info.instanceCount:
            continue
        array = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        _call(where, "nvmlGpuInstanceGetComputeInstances",
              pynvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, array,
              ctypes.byref(count))
        found.extend((array[slot], ci_profile) for slot in range(count.value))
    return found


def apply(change: GpuChange) -> bool:
    """Make one GPU as wanted; True: the GPU needs a reset before the new mode holds.

    With MIG wanted and the mode still pending after the switch (A100), nothing else is
    done: instances can be made only once the mode holds, so the caller resets the GPU and
    applies again."""
    gpu = change.gpu
    where = f"GPU {gpu.index} ({gpu.name})"
    handle = _call(where, "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex,
                   gpu.index)
    uuid = _text(_call(where, "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
    if uuid != gpu.uuid:
        raise MigNvmlError(f"{where}: index {gpu.index} now names {uuid}, not {gpu.uuid}",
                           remedy="rerun: the GPUs are read again")
    model = model_of(gpu)
    if not change.want.mig_enabled:
        return _disable(handle, model, where)
    if model is None:
        raise MigLayoutError(f"{where} has no MIG; it cannot be partitioned")
    current, pending = _mode(handle, where)
    if current != 1 or pending != 1:
        _set_mode(handle, pynvml.NVML_DEVICE_MIG_ENABLE, where)
        current, _ = _mode(handle, where)
        if current != 1:
            return True
    if gpu.nvml_model is None:  # MIG just on: NVML may answer now
        model = discover(handle, gpu.name, gpu.memory_mib * MIB) or model
    _repartition(handle, model, dict(change.want.devices), where)
    return False


def _set_mode(handle: Any, mode: int, where: str) -> None:
    """Ask for a MIG mode; whether it holds now or after a reset, `_mode` tells."""
    _call(where, "nvmlDeviceSetMigMode", pynvml.nvmlDeviceSetMigMode, handle, mode)


def _disable(handle: Any, model: MigModel | None, where: str) -> bool:
    """MIG off: every instance destroyed, then the mode; True when a reset is pending."""
    current, pending = _mode(handle, where)
    if current:
        for gi in _instances(handle, model, where):
            _destroy(gi, where)
    if current or pending:
        _set_mode(handle, pynvml.NVML_DEVICE_MIG_DISABLE, where)
        current, _ = _mode(handle, where)
    return current != 0


def _repartition(handle: Any, model: MigModel, wanted: dict[str, int], where: str) -> None:
    """Keep what fits, destroy the rest, create what is missing at planned placements."""
    instances = _instances(handle, model, where)
    keep, left = [], dict(wanted)
    for gi in instances:
        if gi.complete and left.get(gi.name, 0) > 0:
            keep.append(gi)
            left[gi.name] -= 1
    placed = model.pack(wanted, [(gi.name, gi.start) for gi in keep])
    if placed is None:
        keep, placed = [], model.pack(wanted)
    if placed is None:
        raise MigLayoutError(f"{where} cannot hold this layout; it offers {model.offers()}")
    for gi in instances:
        if not any(gi is kept for kept in keep):
            _destroy(gi, where)
    for name, start in placed[len(keep):]:
        _create(handle, model, name, start, where)


def _destroy(gi: _Gi, where: str) -> None:
    """Compute instances first (NVML refuses a GPU instance that still has them)."""
    for compute in gi.computes:
        _call(where, "nvmlComputeInstanceDestroy", pynvml.nvmlComputeInstanceDestroy, compute)
    _call(where, "nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, gi.handle)


def _create(handle: Any, model: MigModel, name: str, start: int, where: str) -> None:
    """One GPU instance at `start` and its one full compute instance.

    NVML creates by profile *id* (what nvidia-smi prints, e.g. 19 for 1g.5gb), which the
    profile info for the NVML_GPU_INSTANCE_PROFILE_* constant names."""
    profile = model.profiles[name]
    info = _call(where, "nvmlDeviceGetGpuInstanceProfileInfo",
                 pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile.gi_profile)
    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = start, profile.size
    gi = _call(where, f"nvmlDeviceCreateGpuInstanceWithPlacement ({name} at {start})",
               pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, handle, info.id,
               ctypes.byref(spot))
    ci_info = _call(where, "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                    profile.ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    _call(where, f"nvmlGpuInstanceCreateComputeInstance ({name})",
          pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
