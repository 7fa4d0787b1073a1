"""C stand-ins for NVIDIA's user-mode libraries, compiled by the tests that use them.

Each C file follows the real library's own declarations, cited in its header: for NVML,
`nvml.h` (NVIDIA/go-nvml `gen/nvml/nvml.h` at 2f9e261fe40a7a1c54783d66805e8920564763b4),
and, for the MIG models, NVIDIA's MIG User Guide and mig-parted
(nvml_standin_mig_models.c). This module only compiles them with the real
SONAMEs (`libnvidia-ml.so.1`, `libcuda.so.1`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
NVML_SONAME = "libnvidia-ml.so.1"
CUDA_SONAME = "libcuda.so.1"
NVML_SOURCES = ("nvml_standin.c", "nvml_standin_fabric.c", "nvml_standin_metrics.c",
                "nvml_standin_mig.c", "nvml_standin_mig_instances.c",
                "nvml_standin_mig_devices.c", "nvml_standin_mig_models.c", "nvml_standin_gpm.c")


def compile_library(source: str | tuple[str, ...], dest: Path, soname: str,
                    *defines: str, cc: str = "gcc") -> Path:
    """gcc a stand-in (one C file or several) into `dest` with the real library's SONAME
    (well under a second); `cc` another compiler (aarch64-linux-gnu-gcc: an arm64 guest's)."""
    sources = (source,) if isinstance(source, str) else source
    gcc = shutil.which(cc)
    if gcc is None:
        raise RuntimeError(f"{cc} is missing: run `make deps` (scripts/install-deps.sh)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *defines,
                    f"-Wl,-soname,{soname}", "-o", str(dest), *(str(HERE / s) for s in sources)],
                   check=True)
    return dest


def build_standins(lib_dir: Path, *, omit_driver_version: bool = False,
                   omit_fabric_v: bool = False, cc: str = "gcc") -> Path:
    """Both stand-ins in one directory, named by their SONAMEs (as a staged lib64 is).

    `omit_fabric_v`: an NVML without nvmlDeviceGetGpuFabricInfoV (drivers before R550)."""
    defines = (("-DOMIT_DRIVER_VERSION",) if omit_driver_version else ()) + (
        ("-DOMIT_FABRIC_V",) if omit_fabric_v else ())
    compile_library(NVML_SOURCES, lib_dir / NVML_SONAME, NVML_SONAME, *defines, cc=cc)
    compile_library("cuda_standin.c", lib_dir / CUDA_SONAME, CUDA_SONAME, cc=cc)
    return lib_dir
