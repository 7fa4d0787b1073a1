"""NVML through NVIDIA's `pynvml`, bound to one library file chosen by absolute path.

`pynvml` would `dlopen("libnvidia-ml.so.1")` from the linker's search path, which inside the
installer's container is not the library just staged; so the staged file is opened here and
handed to pynvml. NVML's return codes become VerificationError subclasses that say what is
wrong on the node in words an operator can act on.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from installer.errors import VerificationError

T = TypeVar("T")
NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}


class NvmlError(VerificationError):
    """An NVML call failed (the message names the call and NVML's code)."""


class KernelModuleNotLoadedError(NvmlError):
    """NVML error 9: the user-mode driver finds no NVIDIA kernel module."""


class LibraryNotFoundError(NvmlError):
    """NVML error 12, or the staged library is missing or unloadable."""


class GpuLostError(NvmlError):
    """NVML error 15: a GPU stopped answering on the PCI bus."""


class VersionMismatchError(NvmlError):
    """NVML error 18: user-mode driver and kernel module are of different versions."""


class FunctionNotFoundError(NvmlError):
    """NVML error 13: the library lacks a function (too old, or not NVIDIA's)."""


@dataclass(frozen=True)
class Facts:
    """What the messages need to be specific: paths and versions known outside NVML."""

    lib_path: Path
    user_version: str | None = None
    kernel_version: str | None = None
    pci_addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuReport:
    """One GPU as NVML describes it (None: this GPU or driver does not report it)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    persistence_mode: bool | None
    ecc_enabled: bool | None
    retired_pages_pending: bool | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    fabric_state: str | None
    compute_capability: str | None = None  # "8.0"; labels the node's GPU family


@dataclass(frozen=True)
class NvmlSnapshot:
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuReport, ...]


def bind_library(lib_path: Path) -> None:
    """Make pynvml use this file: opened by absolute path, function cache cleared."""
    if not lib_path.is_file():
        raise LibraryNotFoundError(f"NVML library not found at {lib_path}",
                                   remedy="stage the driver (`stage` or `install`) first")
    try:
        library = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        raise LibraryNotFoundError(f"NVML library at {lib_path} cannot be loaded: {exc}",
                                   remedy="re-stage the driver; the file may be damaged") \
            from exc
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def translate(exc: pynvml.NVMLError, call: str, facts: Facts, index: int | None = None
              ) -> NvmlError:
    """One NVML failure as the error an operator can act on."""
    code = exc.value
    where = f" ({call}, NVML error {code})"
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return KernelModuleNotLoadedError(
            "NVIDIA kernel module not loaded" + where,
            remedy="load the driver (`gpu-node-installer load` or `install`); see dmesg")
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return VersionMismatchError(
            f"user-mode driver {facts.user_version or 'unknown'} and kernel module "
            f"{facts.kernel_version or 'unknown'} versions differ" + where,
            remedy="drain the node and reinstall (or reboot) so the loaded module matches")
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return LibraryNotFoundError(f"NVML library not found at {facts.lib_path}" + where)
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return GpuLostError(f"GPU fell off the bus: {_address(facts, index)}" + where,
                            remedy="drain the node and reset or reboot it (look for Xid 79)")
    if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
        return FunctionNotFoundError(
            f"{facts.lib_path} has no NVML function {call}" + where,
            remedy="stage a complete NVIDIA driver package of a supported branch")
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return NvmlError("no permission to open the NVIDIA devices" + where,
                         remedy="run privileged, with the node's /dev mounted")
    return NvmlError(f"NVML call failed: {exc}" + where)


def _address(facts: Facts, index: int | None) -> str:
    if index is None:
        return "GPU unknown"
    ordered = sorted(facts.pci_addresses)
    guess = f", PCI {ordered[index]} by bus order" if index < len(ordered) else ""
    return f"GPU index {index}{guess}"


def call(name: str, facts: Facts, fn: Callable[..., T], *args: Any,
         index: int | None = None) -> T:
    """Run one pynvml function, translating its failure."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise translate(exc, name, facts, index) from exc


def optional(fn: Callable[..., T], *args: Any) -> T | None:
    """A query some GPUs or drivers do not offer: None instead of an error."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in NOT_SUPPORTED:
            return None
        raise


def init(facts: Facts, *, retry_s: float = 0.0) -> None:
    """nvmlInit, retried briefly for a module that was loaded a moment ago."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            pynvml.nvmlInit()
            return
        except pynvml.NVMLError as exc:
            transient = exc.value in (pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                      pynvml.NVML_ERROR_UNKNOWN)
            if not transient or time.monotonic() >= deadline:
                raise translate(exc, "nvmlInit", facts) from exc
        time.sleep(0.25)


def snapshot(facts: Facts, *, retry_s: float = 0.0, fabric: bool = False) -> NvmlSnapshot:
    """Bind, init, read the driver and every GPU, shut down."""
    bind_library(facts.lib_path)
    init(facts, retry_s=retry_s)
    try:
        version = _text(call("nvmlSystemGetDriverVersion", facts,
                             pynvml.nvmlSystemGetDriverVersion))
        cuda = call("nvmlSystemGetCudaDriverVersion", facts,
                    pynvml.nvmlSystemGetCudaDriverVersion)
        count = call("nvmlDeviceGetCount", facts, pynvml.nvmlDeviceGetCount)
        gpus = tuple(_gpu(facts, index, fabric=fabric) for index in range(count))
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return NvmlSnapshot(version, cuda, gpus)


def _gpu(facts: Facts, index: int, *, fabric: bool) -> GpuReport:
    handle = call("nvmlDeviceGetHandleByIndex", facts, pynvml.nvmlDeviceGetHandleByIndex,
                  index, index=index)

    def get(name: str, fn: Callable[..., T]) -> T:
        return call(name, facts, fn, handle, index=index)

    def maybe(name: str, fn: Callable[..., T]) -> T | None:
        try:
            return optional(fn, handle)
        except pynvml.NVMLError as exc:
            raise translate(exc, name, facts, index) from exc

    memory = get("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo)
    ecc = maybe("nvmlDeviceGetEccMode", pynvml.nvmlDeviceGetEccMode)
    retired = maybe("nvmlDeviceGetRetiredPagesPendingStatus",
                    pynvml.nvmlDeviceGetRetiredPagesPendingStatus)
    rows = maybe("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows)
    persistence = maybe("nvmlDeviceGetPersistenceMode", pynvml.nvmlDeviceGetPersistenceMode)
    capability = maybe("nvmlDeviceGetCudaComputeCapability",
                       pynvml.nvmlDeviceGetCudaComputeCapability)
    return GpuReport(
        index=index,
        name=_text(get("nvmlDeviceGetName", pynvml.nvmlDeviceGetName)),
        uuid=_text(get("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID)),
        pci_bus_id=_text(get("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo).busId),
        memory_total_mib=int(memory.total) // (1024 * 1024),
        persistence_mode=None if persistence is None else bool(persistence),
        ecc_enabled=None if ecc is None else bool(ecc[0]),
        retired_pages_pending=None if retired is None else bool(retired),
        remapped_rows_pending=None if rows is None else bool(rows[2]),
        remapped_rows_failure=None if rows is None else bool(rows[3]),
        fabric_state=_fabric_state(handle) if fabric else None,
        compute_capability=None if capability is None else f"{capability[0]}.{capability[1]}",
    )


def _fabric_state(handle: Any) -> str | None:
    """NVSwitch systems: has Fabric Manager finished registering this GPU?"""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError:
        return None
    return FABRIC_STATES.get(int(info.state), f"state-{info.state}")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str) -> str:
    """NVML's `00000000:07:00.0` and sysfs's `0000:07:00.0` as one lower-case form."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()
