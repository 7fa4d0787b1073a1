"""Debian bookworm's real arm64 NVIDIA 535 user-mode packages, downloaded once and cached.

A private apt index of the machine's bookworm archives for arm64 only
(`APT::Architecture=arm64`, its state under the cache's `apt-arm64/`): the machine's apt
setup is never changed and nothing is installed; the .debs are only read (the product's
own reader, or `dpkg-deb -x` for the runfile's staging tree).

    arm64_debs()   -> {"libcuda1": Path(..._arm64.deb), ...} for 535.261.03
    arm64_tree()   -> those debs extracted (libraries in LIB_DIR)
    arm64_runfile() -> NVIDIA-Linux-aarch64-<v>.run (NVIDIA's flat layout) made by makeself
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from artifacts import (
    DEBIAN_VERSIONS,
    DEFAULT_VERSION,
    _locked,
    cache_root,
    extracted_tree,
    makeself_run,
)
from kernel.apt import Apt

# nvvm (86 MB) and ptxjitcompiler (23 MB) add nothing an arch test needs
PACKAGES = ("libcuda1", "libnvidia-ml1", "nvidia-smi")
LIB_DIR = "usr/lib/aarch64-linux-gnu/nvidia/current"
CROSS_GCC = "aarch64-linux-gnu-gcc"  # Debian's gcc-aarch64-linux-gnu


class Arm64Apt(Apt):
    """The machine's bookworm archives (non-free widened), indexed for arm64 only."""

    def options(self) -> list[str]:
        return [*super().options(), "-oAPT::Architecture=arm64",
                "-oAPT::Architectures::=arm64"]


def arm64_apt() -> Apt:
    root = cache_root() / "apt-arm64"
    root.mkdir(parents=True, exist_ok=True)
    return Arm64Apt(root)


def arm64_debs(version: str = DEFAULT_VERSION) -> dict[str, Path]:
    """The arm64 .debs of one NVIDIA version, downloaded on first use."""
    dest = cache_root() / "debs-arm64" / version
    with _locked(f"debs-arm64-{version}"):
        if not dest.is_dir():
            tmp = dest.with_name(dest.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            arm64_apt().download([f"{name}={DEBIAN_VERSIONS[version]}" for name in PACKAGES],
                                 tmp)
            tmp.rename(dest)
    found = {deb.name.split("_", 1)[0]: deb for deb in dest.glob("*_arm64.deb")}
    if set(found) != set(PACKAGES):
        raise RuntimeError(f"{dest} lacks {sorted(set(PACKAGES) - set(found))}; delete it")
    return found


def arm64_tree(version: str = DEFAULT_VERSION) -> Path:
    """The arm64 .debs extracted with `dpkg-deb -x` (cached)."""
    return extracted_tree(cache_root() / "trees-arm64" / version, LIB_DIR,
                          lambda: arm64_debs(version).values(), f"tree-arm64-{version}")


def arm64_runfile(version: str = DEFAULT_VERSION) -> Path:
    """NVIDIA-Linux-aarch64-<v>.run in the cache (a small stand-in firmware file)."""
    target = cache_root() / "run-arm64" / f"NVIDIA-Linux-aarch64-{version}.run"
    with _locked(f"run-arm64-{version}"):
        if not target.is_file():
            make_runfile(target, version, {"gsp_ga10x.bin": b"\x7fGSP arm64 test firmware"})
    return target


def make_runfile(target: Path, version: str, firmware: dict[str, bytes]) -> Path:
    """NVIDIA-Linux-aarch64-<v>.run at `target`: the arm64 files flat at its root, as NVIDIA
    ships them (libraries as regular `lib*.so.<v>`, nvidia-smi, `firmware/`, an installer
    that is never run), made by makeself."""
    tree = arm64_tree(version)
    staging = target.with_name(f"NVIDIA-Linux-aarch64-{version}")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "firmware").mkdir(parents=True)
    for path in (tree / LIB_DIR).iterdir():
        if path.is_file() and not path.is_symlink():
            shutil.copyfile(path, staging / path.name)
    shutil.copyfile(tree / "usr/lib/nvidia/current/nvidia-smi", staging / "nvidia-smi")
    (staging / "nvidia-smi").chmod(0o755)
    for name, data in firmware.items():
        (staging / "firmware" / name).write_bytes(data)
    return makeself_run(staging, target, "aarch64", version,
                        "#!/bin/sh\necho never run\nexit 99\n")


def aarch64_modules(directory: Path, *, version: str, kernel: str, licence: str,
                    depends: dict[str, str]) -> Path:
    """Kernel modules as aarch64 ELF objects made by the cross compiler
    (`gcc-aarch64-linux-gnu`), each with the `.modinfo` a real module carries."""
    directory.mkdir(parents=True, exist_ok=True)
    for stem, needs in depends.items():
        fields = [f"license={licence}", f"version={version}", f"depends={needs}",
                  f"name={stem.replace('-', '_')}",
                  f"vermagic={kernel} SMP preempt mod_unload modversions aarch64"]
        source = directory / f"{stem}.c"
        body = "\\0".join(fields)
        source.write_text('static const char modinfo[] __attribute__((section(".modinfo"), '
                          f'used)) = "{body}";\n')
        subprocess.run([CROSS_GCC, "-c", "-o", str(directory / f"{stem}.ko"), str(source)],
                       check=True)
        source.unlink()
    return directory
