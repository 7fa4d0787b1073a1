"""nvidia-peermem alone, compiled on the node against the RDMA stack that is loaded.

NVIDIA's own recipe, kernel-open/nvidia-peermem/nvidia-peermem.Kbuild (open-gpu-kernel-modules
@ df1c9a3d): the module is built with the kernel's Kbuild (`make modules
NV_KERNEL_MODULES=nvidia-peermem`), and when MLNX_OFED/DOCA is installed its tree (the
first of `$(OFA_DIR)/$(OFA_ARCH)/$(KERNELRELEASE)`, `$(OFA_DIR)/$(KERNELRELEASE)`,
`$(OFA_DIR)/default`, with `OFA_DIR := /usr/src/ofa_kernel`) gives the include path
(`-I.../include`) and `KBUILD_EXTRA_SYMBOLS := .../Module.symvers`, so modpost records
OFED's CRCs for ib_core's exports. conftest.sh decides `NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT`
(the peer-memory client at all) by grepping those same directories' Module.symvers, from
`MLNX_OFED_KERNEL_DIR=/usr/src/ofa_kernel`. NVIDIA's driver container symlinks OFED's tree to
`/usr/src/ofa_kernel/<release>` before compiling (gpu-driver-container @ 06a208ca,
rhel10/nvidia-driver, _create_driver_package). Here the node's OFED tree lives under the
host root, so a private `ofa_kernel/<release>` link in the work folder points at it, `OFA_DIR`
is given to make (a command-line variable overrides the Kbuild's `:=`) and the copied
conftest.sh's one `MLNX_OFED_KERNEL_DIR=` line is re-pointed there; on an inbox stack that
folder does not exist, so neither looks at this image's own /usr/src/ofa_kernel (the
Kbuild would otherwise add a missing Module.symvers, which modpost refuses). Bounded in
time; a failure names the compiler's last line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.packages.builder.compile import build_env
from installer.packages.builder.headers import prepare_headers, which_compiler
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.source import SOURCE_DIR, source_tree
from installer.packages.manifest import Package

PEERMEM = "nvidia-peermem"
TIMEOUT_S = 300.0  # one source file and its conftests: seconds; a hung make is cut here
_CONFTEST_OFED = re.compile(r"^(\s*)MLNX_OFED_KERNEL_DIR=/usr/src/ofa_kernel\s*$", re.M)
_MAX_SOURCE_FILES = 20000


class PeermemBuildError(PackageBuildError):
    """nvidia-peermem could not be built on the node (the message names why)."""

    default_remedy = ("install the node's kernel headers and OFED's kernel sources "
                      "(/usr/src/ofa_kernel), or use DMA-BUF (docs/rdma.md)")


@dataclass(frozen=True)
class PeermemRequest:
    """What to build from: a source package, the node's build tree (a copy, see
    `installer.node.buildtree`), OFED's tree for this kernel (None: the inbox stack), and a
    Module.symvers of the driver's nvidia.ko: built alone, peermem's imports from nvidia
    (nvidia_p2p_*) would be undefined for modpost, which refuses that by default."""

    source: Package
    headers: Path
    ofed: Path | None
    timeout_s: float = TIMEOUT_S
    nvidia_symvers: Path | None = None  # the loaded nvidia's exports (nvidia_p2p_*)


def has_peermem(source: Package) -> bool:
    """Whether the source package carries nvidia-peermem's sources at all."""
    prefix = f"{SOURCE_DIR}/{PEERMEM}/"
    return any(e.kind == "source" and e.path.startswith(prefix) for e in source.manifest.files)


def materialize(source: Package, dest: Path) -> Path:
    """The module tree of the source package, from its verified files (bounded in count)."""
    count = sum(e.kind == "source" for e in source.manifest.files)
    if count > _MAX_SOURCE_FILES:
        raise PeermemBuildError(f"source package {source.manifest.key} has {count} files")
    return source_tree(source, dest)


def build_peermem(request: PeermemRequest, work: Path, log: Any) -> Path:
    """Compile nvidia-peermem into `work` (empty, private); returns the .ko's path."""
    if not has_peermem(request.source):
        raise PeermemBuildError(
            f"source package {request.source.manifest.key} has no {SOURCE_DIR}/{PEERMEM}/",
            remedy="republish the source package from NVIDIA sources that include "
                   "nvidia-peermem (package build --nvidia-source ...)")
    tree = materialize(request.source, work / "src")
    kernel = prepare_headers((request.headers,), work / "in")
    compiler = which_compiler(kernel)
    ofa = work / "ofa_kernel"  # absent on an inbox stack: nothing of this image is used
    if request.ofed is not None:
        ofa.mkdir()
        (ofa / kernel.release).symlink_to(request.ofed)
    _point_conftest(tree / "conftest.sh", ofa)
    if shutil.which("make") is None:
        raise PeermemBuildError("make not found in this image",
                                remedy="run the image's build variant (Dockerfile target "
                                       "`build`), which has make and the compiler")
    cmd = ["make", "-C", str(tree), "modules", f"SYSSRC={kernel.syssrc}",
           f"SYSOUT={kernel.sysout}", f"KERNEL_UNAME={kernel.release}", f"CC={compiler}",
           f"NV_KERNEL_MODULES={PEERMEM}", f"OFA_DIR={ofa}", f"-j{os.cpu_count() or 1}"]
    extra = [str(p) for p in (request.ofed and ofa / kernel.release / "Module.symvers",
                              request.nvidia_symvers) if p]
    if extra:  # on make's command line it replaces the Kbuild's own (OFED's, kept first)
        cmd.append(f"KBUILD_EXTRA_SYMBOLS={' '.join(extra)}")
    started = time.monotonic()
    log.info("compiling nvidia-peermem", release=kernel.release,
             ofed=str(request.ofed) if request.ofed else None, timeout_s=request.timeout_s)
    rc, lines = _run(cmd, tree, request.timeout_s)
    if rc is None:
        raise PeermemBuildError(f"make did not finish in {request.timeout_s:.0f} s (stopped)")
    if rc != 0:
        shown = last_line(lines).replace(f"{tree}/", "").replace(f"{work}/", "")
        raise PeermemBuildError(f"make exited {rc}: {shown}")
    built = next((p for p in (tree / f"{PEERMEM}.ko", tree / PEERMEM / f"{PEERMEM}.ko")
                  if p.is_file()), None)
    if built is None:
        raise PeermemBuildError(f"make succeeded but {PEERMEM}.ko was not built")
    log.info("nvidia-peermem compiled", release=kernel.release,
             elapsed_s=round(time.monotonic() - started, 1))
    return built


def _point_conftest(conftest: Path, ofa: Path) -> None:
    """conftest.sh looks for OFED's Module.symvers under /usr/src/ofa_kernel: here."""
    if not conftest.is_file():
        return
    text = conftest.read_text(errors="replace")
    conftest.write_text(_CONFTEST_OFED.sub(lambda m: f"{m[1]}MLNX_OFED_KERNEL_DIR={ofa}", text))


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int | None, list[str]]:
    """Run make in its own process group; on timeout the whole group is killed."""
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=build_env([]), text=True,
                          errors="replace", start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, []
    return proc.returncode, out.splitlines()[-2000:]


def last_line(lines: list[str]) -> str:
    """The compiler's word: the last line that says error, else the last line at all."""
    kept = [line.strip() for line in lines if line.strip()]
    found = next((line for line in reversed(kept) if "error" in line.lower()
                  and not line.startswith("make")), kept[-1] if kept else "no output")
    return found.replace("\u2018", "'").replace("\u2019", "'")[:300]
