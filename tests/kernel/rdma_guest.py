"""Runs inside the guest: nvidia-peermem on the real kernel's inbox ib_core.

The node's own ib_core (the guest kernel's, from /lib/modules) is loaded first, as a NIC
driver would at boot. Then the load stage runs with RDMA=on over a package of the stand-in
nvidia, nvidia-uvm and a peermem-shaped module built against the kernel's headers (its
__versions carry the kernel's CRC of ib_register_client): it must go in after nvidia.
A copy whose recorded CRC is changed must be refused before it is loaded, naming both
CRCs, with nvidia still loaded; then the kernel itself is asked to load that copy, to show
it refuses it too ("disagrees about version of symbol"). Last, with a rebuild allowed
(BUILD_FALLBACK=auto's seam), the refused package is offered again: nvidia-peermem is
compiled here, in the guest, by the installer's builder (`packages.builder.peermem`: make and
the kernel's compiler) from the NVIDIA-shaped tree tests/kernel/peermem_source against the
running kernel's headers, checked and loaded. Results: $OUT/results.json.
Usage: python tests/kernel/rdma_guest.py KO_DIR OUT_DIR HEADERS_DIR
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

from installer.cli import logs
from installer.node import elf, kmod, modversions, rdma
from installer.node.host import RealHost, Roots
from installer.packages.builder.peermem import PeermemRequest, build_peermem
from installer.stages import load
from installer.testing.kernel import ModuleFile, write_package

HOST = RealHost(Roots(Path("/"), Path("/proc"), Path("/sys"), Path("/dev")))
RELEASE = os.uname().release
VERSION = "535.261.03"
WORK = Path("/tmp/gni-rdma")
SYMBOL = b"ib_register_client"
STANDIN = Path(__file__).resolve().parent / "peermem_source"


def _package(name: str, ko: Path, peermem: bytes) -> Any:
    modules = [ModuleFile("nvidia", ko / "nvidia.ko"),
               ModuleFile("nvidia_uvm", ko / "nvidia-uvm.ko", ("nvidia",))]
    return write_package(WORK / name, modules, driver_version=VERSION, kernel_release=RELEASE,
                         extra_files={"kernel/nvidia-peermem.ko": (peermem, "module")})


def _patched(data: bytes) -> bytes:
    """The module with ib_register_client's recorded CRC changed (one bit flipped)."""
    _, table = elf.sections(data)
    versions = next(s for s in table if s.name == b"__versions")
    for start in range(versions.offset, versions.offset + versions.size, 64):
        if data[start + 8:start + 64].split(b"\0")[0] == SYMBOL:
            crc = struct.unpack_from("<Q", data, start)[0]
            out = bytearray(data)
            struct.pack_into("<Q", out, start, crc ^ 0x1)
            return bytes(out)
    raise SystemExit("the test module records no CRC for ib_register_client")


def _kmsg() -> list[str]:
    """The kernel log's lines so far (non-blocking read of /dev/kmsg)."""
    lines = []
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                lines.append(os.read(fd, 8192).decode(errors="replace").strip())
            except BlockingIOError:
                break
    finally:
        os.close(fd)
    return lines


def _observed(result: load.LoadResult) -> dict[str, Any]:
    return {"loaded": result.loaded, "kept": result.kept,
            "verdict": result.rdma.to_dict() if result.rdma else None,
            "warnings": result.warnings,
            "modules": sorted(m.name for m in kmod.loaded_modules(HOST) or []),
            "nvidiactl": Path("/dev/nvidiactl").exists()}


def _rebuild(ko: Path, headers: Path) -> Any:
    """BUILD_FALLBACK=auto's seam: the source package's peermem compiled here."""
    files = {f"kernel-source/{p.relative_to(STANDIN).as_posix()}": (p.read_bytes(), "source")
             for p in sorted(STANDIN.rglob("*")) if p.is_file()}
    source = write_package(WORK / "source", [], driver_version=VERSION,
                           kernel_release="source", extra_files=files)

    def build(stack: rdma.RdmaStack, release: str) -> Path:
        work = WORK / "rebuild"
        work.mkdir()
        symvers = WORK / "nvidia.symvers"  # the loaded stand-in nvidia's exports
        symvers.write_text(modversions.symvers_text(
            modversions.exported((ko / "nvidia.ko").read_bytes()), "nvidia"))
        return build_peermem(PeermemRequest(source, headers, None, nvidia_symvers=symvers),
                             work, logs.get_logger())
    return build


def main(ko: Path, out: Path, headers: Path) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    core = Path("/lib/modules") / RELEASE / "kernel/drivers/infiniband/core/ib_core.ko"
    HOST.finit_module(core, "")
    data = (ko / "nvidia-peermem.ko").read_bytes()
    stack = rdma.read_stack(HOST)
    exports, source = rdma.loaded_exports(HOST, stack, RELEASE)
    results: dict[str, Any] = {
        "stack": stack.to_dict(), "source": source,
        "recorded": modversions.recorded(data).get(SYMBOL.decode()),
        "exported": exports.get(SYMBOL.decode()),
        "depends": kmod.modinfo_depends(data),
        "build_id_note": Path("/sys/module/ib_core/notes/.note.gnu.build-id").is_file()}
    results["match"] = _observed(load.load_package(HOST, _package("match", ko, data),
                                                   rdma_mode="on"))
    results["ib_core_holders"] = sorted(p.name for p in Path("/sys/module/ib_core/holders")
                                        .iterdir())
    HOST.delete_module("nvidia_peermem")
    patched = _patched(data)
    package = _package("patched", ko, patched)
    results["patched"] = _observed(load.load_package(HOST, package, rdma_mode="on"))
    try:
        HOST.finit_module(package.path_of("kernel/nvidia-peermem.ko"), "")
        results["kernel_errno"] = 0
    except OSError as exc:
        results["kernel_errno"] = exc.errno
    results["disagrees"] = [line for line in _kmsg() if "disagrees about version" in line]
    rebuilt = load.load_package(HOST, _package("rebuilt", ko, patched), rdma_mode="on",
                                peermem_rebuild=_rebuild(ko, headers))
    results["rebuilt"] = _observed(rebuilt)
    built = WORK / "rebuild" / "src" / "nvidia-peermem.ko"
    recorded = modversions.recorded(built.read_bytes()) if built.is_file() else {}
    results["rebuilt_recorded"] = recorded.get(SYMBOL.decode())
    results["rebuilt_nvidia_crc"] = recorded.get("nvgni_core_version")
    results["nvidia_exports"] = modversions.exported((ko / "nvidia.ko").read_bytes())
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
