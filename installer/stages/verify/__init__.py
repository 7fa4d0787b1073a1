"""The verify stage: does the staged user-mode driver see every GPU through the loaded module?

NVML (through `pynvml`, bound to the staged `libnvidia-ml.so.1`): driver version equals the
package's, GPU count equals the PCI count from detect, per-GPU health facts. Then the CUDA
driver API through the staged `libcuda.so.1`; `--cuda-smoke` also runs a kernel on every GPU.
A failure withdraws readiness, so a node is never "ready" with a driver that was not checked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.context import Context
from installer.errors import VerificationError
from installer.installdir.readiness import clear_readiness
from installer.installdir.versions import current_name, read_staged
from installer.node import kmod, pci
from installer.node.facts import NodeInfo

if TYPE_CHECKING:
    from installer.stages.verify.cuda import CudaReport
    from installer.stages.verify.nvml import GpuReport

NVML_LIB = "libnvidia-ml.so.1"
CUDA_LIB = "libcuda.so.1"
INIT_RETRY_AFTER_LOAD_S = 5.0


class DriverVersionMismatchError(VerificationError):
    """NVML reports another driver version than the one staged."""


class GpuCountMismatchError(VerificationError):
    """NVML or CUDA sees fewer (or more) GPUs than the PCI bus shows."""


@dataclass(frozen=True)
class Expected:
    """What verification compares against (unknown fields are not checked)."""

    lib_dir: Path
    driver_version: str | None
    kernel_release: str
    flavour: str | None
    digest: str | None
    gpu_addresses: tuple[str, ...]
    nvswitches: int = 0
    just_loaded: bool = False
    gpu_count: int | None = None

    @property
    def count(self) -> int:
        """GPUs NVML and CUDA must see: the PCI count unless told otherwise."""
        return len(self.gpu_addresses) if self.gpu_count is None else self.gpu_count


@dataclass(frozen=True)
class VerifyResult:
    """A passed verification (a failure raises instead)."""

    driver_version: str
    cuda_version: str
    kernel_release: str
    flavour: str | None
    digest: str | None
    lib_dir: str
    gpus: tuple[GpuReport, ...]
    cuda: CudaReport | None
    warnings: tuple[str, ...] = field(default=())
    passed: bool = True

    def log_fields(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "cuda_version": self.cuda_version,
                "gpus": len(self.gpus), "cuda_smoke": bool(self.cuda and self.cuda.smoke),
                "warnings": len(self.warnings)}

    def to_dict(self) -> dict[str, Any]:
        cuda = None if self.cuda is None else {
            "driver_version": self.cuda.driver_version, "device_count": self.cuda.device_count,
            "smoke": [asdict(s) for s in self.cuda.smoke]}
        return {"passed": self.passed, "driver_version": self.driver_version,
                "cuda_version": self.cuda_version, "kernel_release": self.kernel_release,
                "flavour": self.flavour, "package_digest": self.digest,
                "lib_dir": self.lib_dir, "gpus": [asdict(g) for g in self.gpus],
                "cuda": cuda, "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"Driver:          {self.driver_version} (CUDA {self.cuda_version})",
                 f"Libraries:       {self.lib_dir}",
                 f"GPUs:            {len(self.gpus)}"]
        lines += [_gpu_line(gpu) for gpu in self.gpus]
        for smoke in self.cuda.smoke if self.cuda else ():
            lines.append(f"  CUDA smoke ok: GPU {smoke.ordinal} {smoke.pci_bus_id} "
                         f"{smoke.name} ({smoke.elements} elements)")
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def _flag(value: bool | None) -> str:
    return "n/a" if value is None else ("on" if value else "off")


def _gpu_line(gpu: GpuReport) -> str:
    return (f"  {gpu.index}  {gpu.pci_bus_id}  {gpu.name:<24} {gpu.uuid}  "
            f"{gpu.memory_total_mib} MiB  persistence={_flag(gpu.persistence_mode)} "
            f"ecc={_flag(gpu.ecc_enabled)}")


def run(ctx: Context) -> VerifyResult:
    """Stage entry point: verify what was staged in the install dir."""
    return verify(ctx, cuda_smoke=False)


def verify(ctx: Context, *, cuda_smoke: bool, lib_dir: Path | None = None,
           gpu_count: int | None = None) -> VerifyResult:
    """NVML then CUDA; any failure over the install dir first withdraws readiness.

    `gpu_count` replaces the PCI count, for a container that sees only some of the GPUs.
    """
    try:
        expected = replace(expected_from_context(ctx, lib_dir=lib_dir), gpu_count=gpu_count)
        return _verify(ctx, expected, cuda_smoke=cuda_smoke)
    except VerificationError:
        if lib_dir is None:
            clear_readiness(ctx.config, ctx.host.roots)
        raise


def _verify(ctx: Context, expected: Expected, *, cuda_smoke: bool) -> VerifyResult:
    from installer.stages.verify import cuda, nvml

    loaded = kmod.loaded_driver(ctx.host)
    facts = nvml.Facts(expected.lib_dir / NVML_LIB, expected.driver_version,
                       loaded.version if loaded else None, expected.gpu_addresses)
    snap = nvml.snapshot(facts, retry_s=INIT_RETRY_AFTER_LOAD_S if expected.just_loaded else 0,
                         fabric=expected.nvswitches > 0)
    _check_version(snap.driver_version, expected)
    _check_count("NVML", len(snap.gpus), expected, [g.pci_bus_id for g in snap.gpus])
    report = cuda.check_driver(expected.lib_dir / CUDA_LIB, smoke=cuda_smoke)
    _check_count("CUDA", report.device_count, expected, None)
    return VerifyResult(snap.driver_version, cuda.format_version(snap.cuda_driver_version),
                        expected.kernel_release, expected.flavour, expected.digest,
                        str(expected.lib_dir), snap.gpus, report,
                        tuple(_health_warnings(snap.gpus)))


def _check_version(found: str, expected: Expected) -> None:
    if expected.driver_version and found != expected.driver_version:
        raise DriverVersionMismatchError(
            f"NVML reports driver {found}, but {expected.driver_version} was staged",
            remedy="rerun `install`; another driver's libraries are being picked up")


def _check_count(api: str, found: int, expected: Expected, bus_ids: list[str] | None) -> None:
    want = expected.count
    if found == want:
        return
    from installer.stages.verify.nvml import normalize_bus_id

    missing = ""
    where = "were expected" if expected.gpu_count is not None else "are on the PCI bus"
    if bus_ids is not None:
        seen = {normalize_bus_id(b) for b in bus_ids}
        lost = [a for a in expected.gpu_addresses if normalize_bus_id(a) not in seen]
        missing = f"; not seen: {', '.join(lost)}" if lost else ""
    raise GpuCountMismatchError(
        f"{api} sees {found} GPU(s) but {want} {where}{missing}",
        remedy="check dmesg for NVRM/Xid errors on the missing GPUs; drain and reset the node")


def _health_warnings(gpus: tuple[GpuReport, ...]) -> list[str]:
    warnings = []
    for gpu in gpus:
        if gpu.retired_pages_pending or gpu.remapped_rows_pending:
            warnings.append(f"GPU {gpu.index} ({gpu.pci_bus_id}) has memory pages pending "
                            "retirement: reset the GPU when it is idle")
        if gpu.remapped_rows_failure:
            warnings.append(f"GPU {gpu.index} ({gpu.pci_bus_id}) failed a row remapping: "
                            "the GPU needs service")
        if gpu.fabric_state not in (None, "completed", "not-supported"):
            warnings.append(f"GPU {gpu.index} fabric state is {gpu.fabric_state}: "
                            "is Fabric Manager running?")
    return warnings


def usable_gpu_addresses(node: NodeInfo) -> tuple[str, ...]:
    """GPUs the NVIDIA driver can drive: not bound to nouveau or vfio-pci."""
    return tuple(g.pci_address for g in node.gpus if g.driver in (None, "", "none", "nvidia"))


def expected_from_context(ctx: Context, *, lib_dir: Path | None = None) -> Expected:
    """From this run's stage result, else from what the install dir has staged now."""
    node = ctx.node_info()
    gpus = usable_gpu_addresses(node)
    nvswitches = len([f for f in node.functions if f.kind == pci.KIND_NVSWITCH])
    if lib_dir is not None:
        return Expected(lib_dir, None, node.kernel_release, None, None, gpus, nvswitches)
    root = ctx.install_root
    name = current_name(root)
    meta = read_staged(root, name) if name else None
    if meta is None:
        raise VerificationError(f"nothing is staged in {ctx.config.install_dir}",
                                remedy="run `install` (or `fetch` and `stage`) first")
    return Expected(root / "lib64", str(meta.get("driver_version")),
                    str(meta.get("kernel_release", node.kernel_release)),
                    meta.get("flavour"), meta.get("digest"), gpus, nvswitches,
                    just_loaded=ctx.modules_loaded)

