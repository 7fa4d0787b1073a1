"""The CUDA driver API through ctypes: init, version, device count, and a vector-add smoke.

Nothing is compiled: the smoke test hands a small PTX kernel to `cuModuleLoadData`, so the
driver's own JIT builds it for whatever GPU is there, and the result is checked on the host.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path

from installer.errors import VerificationError

# CUresult codes an operator meets, with what they mean on a node.
MEANINGS: dict[int, tuple[str, str]] = {
    1: ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "GPU memory exhausted"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "cuInit has not succeeded"),
    46: ("CUDA_ERROR_DEVICES_UNAVAILABLE", "GPUs busy or in exclusive-process mode"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA device visible: kernel module not loaded, "
          "/dev/nvidia* missing, or hidden by CUDA_VISIBLE_DEVICES"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    209: ("CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image for this GPU"),
    218: ("CUDA_ERROR_INVALID_PTX", "the PTX JIT rejected the kernel"),
    221: ("CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "libnvidia-ptxjitcompiler.so.1 is missing"),
    222: ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "PTX newer than this driver"),
    719: ("CUDA_ERROR_LAUNCH_FAILED", "the kernel faulted while running"),
    802: ("CUDA_ERROR_SYSTEM_NOT_READY", "system not ready: on NVSwitch nodes start "
          "Fabric Manager"),
    803: ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "user-mode driver and kernel module "
          "versions differ"),
    804: ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward-compat driver not "
          "supported on this GPU"),
    999: ("CUDA_ERROR_UNKNOWN", "unknown error: often a module/user-mode mismatch or a GPU "
          "in a bad state; see dmesg for Xid messages"),
}

VADD_PTX = b"""\
.version 6.0
.target sm_50
.address_size 64

.visible .entry vadd(
    .param .u64 vadd_a,
    .param .u64 vadd_b,
    .param .u64 vadd_c,
    .param .u32 vadd_n
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [vadd_a];
    ld.param.u64 %rd2, [vadd_b];
    ld.param.u64 %rd3, [vadd_c];
    ld.param.u32 %r2, [vadd_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r1, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
\x00"""

N_ELEMENTS = 4096
BLOCK = 256


class CudaError(VerificationError):
    """A CUDA driver API call failed."""


@dataclass(frozen=True)
class DeviceSmoke:
    """One GPU's smoke result."""

    ordinal: int
    name: str
    pci_bus_id: str
    elements: int


@dataclass(frozen=True)
class CudaReport:
    driver_version: int
    device_count: int
    smoke: tuple[DeviceSmoke, ...] = ()

    @property
    def version_text(self) -> str:
        return format_version(self.driver_version)


def format_version(version: int) -> str:
    """CUDA's 12020 as "12.2"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def describe(code: int) -> str:
    name, meaning = MEANINGS.get(code, (f"CUresult {code}", "see the CUDA driver API docs"))
    return f"{name} ({code}): {meaning}"


class Driver:
    """The CUDA driver library opened by absolute path."""

    def __init__(self, lib_path: Path) -> None:
        if not lib_path.is_file():
            raise CudaError(f"CUDA driver library not found at {lib_path}",
                            remedy="stage the driver (`stage` or `install`) first")
        try:
            self.lib = ctypes.CDLL(str(lib_path))
        except OSError as exc:
            raise CudaError(f"CUDA driver library at {lib_path} cannot be loaded: {exc}") \
                from exc
        self.path = lib_path

    def check(self, name: str, *args: object) -> None:
        """Call one driver API function; a non-zero CUresult becomes a CudaError."""
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise CudaError(f"{self.path} has no CUDA function {name}",
                            remedy="stage a complete NVIDIA driver package") from None
        code = int(fn(*args))
        if code != 0:
            raise CudaError(f"CUDA {name} failed: {describe(code)}")

    def basics(self) -> CudaReport:
        self.check("cuInit", ctypes.c_uint(0))
        version, count = ctypes.c_int(), ctypes.c_int()
        self.check("cuDriverGetVersion", ctypes.byref(version))
        self.check("cuDeviceGetCount", ctypes.byref(count))
        return CudaReport(version.value, count.value)

    def smoke(self, ordinal: int) -> DeviceSmoke:
        """Run the PTX vector add on one GPU and compare with the host's sums."""
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self.check("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        name = ctypes.create_string_buffer(256)
        self.check("cuDeviceGetName", name, ctypes.c_int(256), device)
        bus = ctypes.create_string_buffer(64)
        self.check("cuDeviceGetPCIBusId", bus, ctypes.c_int(64), device)
        self.check("cuCtxCreate_v2", ctypes.byref(context), ctypes.c_uint(0), device)
        try:
            self._vector_add(ordinal)
        finally:
            self.lib.cuCtxDestroy_v2(context)
        return DeviceSmoke(ordinal, name.value.decode(errors="replace"),
                           bus.value.decode(errors="replace"), N_ELEMENTS)

    def _vector_add(self, ordinal: int) -> None:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self.check("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(VADD_PTX))
        try:
            self.check("cuModuleGetFunction", ctypes.byref(function), module, b"vadd")
            host = _inputs()
            out = self._launch(function, host)
        finally:
            self.lib.cuModuleUnload(module)
        bad = [i for i in range(N_ELEMENTS)
               if not math.isclose(out[i], host[0][i] + host[1][i], rel_tol=1e-6)]
        if bad:
            raise CudaError(f"GPU {ordinal} computed a wrong vector sum at {len(bad)} of "
                            f"{N_ELEMENTS} elements (first at {bad[0]})",
                            remedy="drain the node and check the GPU (dmesg Xid, nvidia-smi -q)")

    def _launch(self, function: ctypes.c_void_p, host: tuple[ctypes.Array[ctypes.c_float], ...]
                ) -> ctypes.Array[ctypes.c_float]:
        size = ctypes.sizeof(ctypes.c_float) * N_ELEMENTS
        ptrs = [ctypes.c_uint64() for _ in range(3)]
        try:
            for ptr in ptrs:
                self.check("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
            for ptr, data in zip(ptrs[:2], host, strict=True):
                self.check("cuMemcpyHtoD_v2", ptr, data, ctypes.c_size_t(size))
            count = ctypes.c_uint32(N_ELEMENTS)
            params = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(p), ctypes.c_void_p)
                                             for p in (*ptrs, count)])
            grid = (N_ELEMENTS + BLOCK - 1) // BLOCK
            self.check("cuLaunchKernel", function, ctypes.c_uint(grid), ctypes.c_uint(1),
                       ctypes.c_uint(1), ctypes.c_uint(BLOCK), ctypes.c_uint(1),
                       ctypes.c_uint(1), ctypes.c_uint(0), None, params, None)
            self.check("cuCtxSynchronize")
            out = (ctypes.c_float * N_ELEMENTS)()
            self.check("cuMemcpyDtoH_v2", out, ptrs[2], ctypes.c_size_t(size))
            return out
        finally:
            for ptr in ptrs:
                if ptr.value:
                    self.lib.cuMemFree_v2(ptr)


def _inputs() -> tuple[ctypes.Array[ctypes.c_float], ...]:
    a = (ctypes.c_float * N_ELEMENTS)(*[float(i) for i in range(N_ELEMENTS)])
    b = (ctypes.c_float * N_ELEMENTS)(*[0.5 * i + 1.0 for i in range(N_ELEMENTS)])
    return a, b


def check_driver(lib_path: Path, *, smoke: bool) -> CudaReport:
    """cuInit, version and count; with `smoke`, the vector add on every GPU."""
    driver = Driver(lib_path)
    report = driver.basics()
    if not smoke:
        return report
    results = tuple(driver.smoke(ordinal) for ordinal in range(report.device_count))
    return CudaReport(report.driver_version, report.device_count, results)
