"""NVIDIA's runfile as the COS bucket serves it (`tests/cosbucket.py`):
NVIDIA-Linux-x86_64-<v>.run made by Debian's makeself, its root NVIDIA's internal layout
(the real user-mode libraries from Debian's 535 packages, tests/artifacts.py, `nvidia-smi`, a
`nvidia-installer` that must never run, `.manifest`, small kernel sources, the GSP
firmware), cached under `artifacts.cache_root()` keyed by its inputs' bytes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RUNFILE_LAYOUT = b"cosbucket-runfile-1"  # bump when the runfile's staging changes


def runfile_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"



@contextmanager
def _locked(name: str) -> Iterator[None]:
    import artifacts

    locks = artifacts.cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def runfile_sources(version: str, standins: Path | None) -> dict[str, Path]:
    """The files a runfile's root takes from Debian's real tree (or the stand-ins)."""
    import artifacts

    tree = artifacts.nvidia_tree(version)
    libs = tree / artifacts.LIB_DIR
    sources = {p.name: p for p in sorted(libs.iterdir()) if p.is_file() and not p.is_symlink()}
    smi = tree / "usr/lib/nvidia/current"
    sources["nvidia-smi"] = smi / "nvidia-smi"
    sources["nvidia-smi.1.gz"] = smi / "nvidia-smi.1.gz"
    if standins is not None:
        sources[f"libnvidia-ml.so.{version}"] = standins / "libnvidia-ml.so.1"
        sources[f"libcuda.so.{version}"] = standins / "libcuda.so.1"
    return sources


def cached_runfile(version: str, firmware: dict[str, bytes], *, standins: Path | None = None,
                   xz: bool = False) -> Path:
    """NVIDIA-Linux-x86_64-<v>.run made by Debian's makeself, cached by its inputs' bytes."""
    import artifacts

    sources = runfile_sources(version, standins)
    key = runfile_key(version, firmware, sources, xz=xz)
    target = artifacts.cache_root() / "cos-run" / key / runfile_name(version)
    with _locked(f"cos-run-{key}"):
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            staging = Path(tmp) / f"NVIDIA-Linux-x86_64-{version}"
            _stage_runfile(staging, version, sources, firmware)
            partial = Path(tmp) / (target.name + ".partial")
            compress = ["--xz", "--complevel", "1"] if xz else []
            subprocess.run(["makeself", "--nox11", "--quiet", *compress, str(staging),
                            str(partial),
                            f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}",
                            "./nvidia-installer"], check=True, stdout=subprocess.DEVNULL)
            os.replace(partial, target)
    return target


def runfile_key(version: str, firmware: dict[str, bytes], sources: dict[str, Path], *,
                xz: bool) -> str:
    """The cache key: the staging code's version and every input's bytes."""
    digest = hashlib.sha256(RUNFILE_LAYOUT + version.encode() + (b"xz" if xz else b"gz"))
    for name, path in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + _file_digest(path))
    for name, data in sorted(firmware.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


def _file_digest(path: Path) -> bytes:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").digest()


def _stage_runfile(staging: Path, version: str, sources: dict[str, Path],
                   firmware: dict[str, bytes]) -> None:
    staging.mkdir(parents=True)
    for name, path in sources.items():
        shutil.copyfile(path, staging / name)
        (staging / name).chmod(0o755 if name == "nvidia-smi" else 0o644)
    installer = staging / "nvidia-installer"
    installer.write_text("#!/bin/sh\necho 'nvidia-installer: never run by tests' >&2\n"
                         "exit 99\n")
    installer.chmod(0o755)
    (staging / "firmware").mkdir()
    for name, data in firmware.items():
        (staging / "firmware" / name).write_bytes(data)
    sources_text = {
        "kernel/Kbuild": "# NVIDIA proprietary kernel modules (placeholder)\n",
        "kernel/nvidia/nv.c": "/* placeholder for NVIDIA's nv.c */\n",
        "kernel/nvidia/nv-kernel.o_binary": "placeholder\n",
        "kernel-open/Kbuild": "# NVIDIA open kernel modules (placeholder)\n",
        "kernel-open/nvidia/nv.c": "/* placeholder for NVIDIA's open nv.c */\n",
        "kernel-open/nvidia-uvm/uvm.c": "/* placeholder */\n",
        "kernel-open/conftest.sh": "#!/bin/sh\nexit 0\n",
    }
    for rel, text in sources_text.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_text(text)
    entries = [f"{name} 0644 CUDA_LIB NATIVE" for name in sorted(sources)
               if name.startswith("lib")]
    entries += ["nvidia-smi 0755 UTILITY_BINARY", "nvidia-smi.1.gz 0644 MANPAGE",
                *(f"firmware/{n} 0644 FIRMWARE NATIVE" for n in sorted(firmware)),
                "kernel-open/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:open"]
    (staging / ".manifest").write_text(
        "NVIDIA Accelerated Graphics Driver for Linux-x86_64\n"
        f"{version}\n0\nx86_64\n0\n" + "".join(e + "\n" for e in entries))
