"""The arm64 guest: Debian bookworm's linux-image-arm64 under `qemu-system-aarch64 -M virt
-cpu max` (TCG: no KVM for a foreign architecture), its root a tree extracted from Debian's
arm64 packages (python3 and what the product imports), the product's wheel unpacked into it.

The x86_64 guest shares the host's / over 9p; an arm64 guest cannot run the host's x86_64
binaries, so it gets its own root: `mmdebstrap --variant=extract` (packages unpacked, no
maintainer scripts, so no emulated chroot is needed on the host), cached under the cache
root keyed by the package list and the index's python3 version. The guest's writes land in
a tmpfs overlay and vanish with it: the x86_64 guest's initramfs (guest.INIT_SCRIPT) with
Debian's arm64 busybox-static.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from . import assets, guest
from .apt import AssetError, cache_root, log, run
from .arm64cross import arm64_apt, cross_package
from .assets import Kernel, locked, staging

QEMU = "qemu-system-aarch64"
ARCH = "arm64"
REPO = Path(__file__).resolve().parents[2]
# The guest's root: python3, the product's dependencies Debian packages for arm64, and the
# tools the guest scripts use. nvidia-ml-py is pure Python and not in bookworm: it is copied
# from the host's environment with the wheel (see `product_site`).
ROOTFS_PACKAGES = (
    "python3", "python3-click", "python3-requests", "python3-tenacity", "python3-structlog",
    "python3-cryptography", "python3-yaml", "python3-h2", "python3-prometheus-client",
    "bash", "coreutils", "sed", "grep", "mount", "util-linux", "iproute2", "kmod",
)  # fmt: skip
# Pure-Python modules the product imports that bookworm has no arm64 package of (new enough).
HOST_PURE_MODULES = ("pynvml",)
CROSS_CC = "aarch64-linux-gnu-gcc"  # the NVML/CUDA stand-ins' (+ libc6-dev-arm64-cross)

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def qemu_unavailable_reason() -> str | None:
    """Why no arm64 guest can boot here (the only reason its tests may skip), or None."""
    path = shutil.which(QEMU)
    if path is None:
        return f"{QEMU} not found (apt-get install qemu-system-arm)"
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"{QEMU} --version exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return None


def kernel_release() -> str:
    """The release bookworm's linux-image-arm64 points at (or GNI_TEST_ARM64_KERNEL_RELEASE)."""
    pinned = os.environ.get("GNI_TEST_ARM64_KERNEL_RELEASE")
    if pinned:
        return pinned
    out = arm64_apt().query("depends", "linux-image-arm64")
    m = re.search(r"Depends: linux-image-(\d\S*-arm64)$", out, re.M)
    if not m:
        raise AssetError(f"cannot tell which kernel linux-image-arm64 depends on:\n{out}")
    return m[1]


def ensure_kernel() -> Kernel:
    """linux-image-<release>-arm64 extracted and depmod'ed (cached like the x86_64 one)."""
    return assets.ensure_kernel(kernel_release(), arm64_apt())


def ensure_busybox() -> Path:
    """Debian's arm64 busybox-static for the initramfs (extracted, cached per version)."""
    a = arm64_apt()
    version = a.version("busybox-static")
    dest = cache_root() / f"busybox-{ARCH}" / version
    with locked(f"busybox-{ARCH}"):
        if not dest.is_dir():
            log(f"fetching busybox-static {version} ({ARCH})")
            with staging(dest) as tmp:
                a.download_extract(f"busybox-static={version}", tmp)
    return dest / "bin" / "busybox"


def ensure_rootfs(kernel: Kernel) -> Path:
    """The guest's root tree: ROOTFS_PACKAGES and their dependencies unpacked for arm64, and
    the kernel's modules tree (hard links) at /lib/modules/<release>, where the x86_64
    guest's init (guest.INIT_SCRIPT, used as is) would bind the host's."""
    a = arm64_apt()
    key = hashlib.sha256("\n".join([*ROOTFS_PACKAGES, a.version("python3"), a.version("libc6"),
                                    kernel.release]).encode()).hexdigest()[:12]
    dest = cache_root() / f"rootfs-{ARCH}" / key
    with locked(f"rootfs-{ARCH}"):
        if not dest.is_dir():
            log(f"mmdebstrap --variant=extract --arch={ARCH} ({len(ROOTFS_PACKAGES)} packages)")
            sources = a.root / "sources.list.d" / "gni-test.sources"
            with staging(dest) as tmp:
                run(["mmdebstrap", "--quiet", "--variant=extract", f"--arch={ARCH}",
                     f"--include={','.join(ROOTFS_PACKAGES)}", "bookworm", str(tmp),
                     str(sources)])
                shutil.rmtree(tmp / "dev", ignore_errors=True)  # the guest mounts devtmpfs
                if not (tmp / "bin" / "sh").exists():
                    (tmp / "bin" / "sh").symlink_to("bash")  # dash's postinst is not run
                (tmp / "lib" / "modules").mkdir(parents=True, exist_ok=True)
                run(["cp", "-al", str(kernel.modules_dir),
                     str(tmp / "lib" / "modules" / kernel.release)])
    return dest


def _source_digest() -> str:
    h = hashlib.sha256((REPO / "pyproject.toml").read_bytes())
    for path in sorted((REPO / "installer").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def product_wheel() -> Path:
    """The product's wheel (`pip wheel --no-deps`: pure Python), cached by its sources."""
    dest = cache_root() / "wheels" / _source_digest()
    with locked("wheels"):
        if not dest.is_dir():
            log("building the product's wheel")
            with staging(dest) as tmp:
                run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp),
                     str(REPO)])
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise AssetError(f"{dest} holds {len(wheels)} wheels, not 1; delete it to rebuild")
    return wheels[0]


def product_site(out: Path) -> Path:
    """The wheel unpacked (as pip would, into site-packages) with HOST_PURE_MODULES beside."""
    site = out / "site"
    with zipfile.ZipFile(product_wheel()) as whl:
        whl.extractall(site)
    for name in HOST_PURE_MODULES:
        module = __import__(name)
        shutil.copy2(str(module.__file__), site)
    return site


def _qemu_command(kernel: Kernel, out: Path, cmdline: str, memory_mb: int) -> list[str]:
    append = f"console=ttyAMA0 quiet panic=-1 rdinit=/init gni.out={out} {cmdline}"
    initrd = guest.ensure_initramfs(kernel, ensure_busybox())
    return [
        QEMU, "-M", "virt", "-cpu", "max,pauth-impdef=on", "-accel", "tcg",
        "-smp", str(min(2, os.cpu_count() or 1)), "-m", str(memory_mb),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", "stdio", "-monitor", "none",
        "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd), "-append", append.strip(),
        "-virtfs", f"local,path={ensure_rootfs(kernel)},mount_tag=hostroot,"
                   f"{guest.ROOT_SHARE_OPTS}",
        "-virtfs", f"local,path={out},mount_tag=out,security_model=none",
    ]  # fmt: skip


def run_in_guest(script: str, *, kernel: Kernel, cmdline: str = "", timeout: float = 600.0,
                 env: dict[str, str] | None = None, memory_mb: int = 1024,
                 out_dir: Path | None = None) -> guest.GuestResult:
    """Boot the arm64 kernel, run `script` with bash as root in the arm64 root, the product
    installed from its wheel (`python3 -m installer`); results come back as in the x86_64
    guest's `run_in_guest` ($GNI_OUT, exit code, output, console)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="gni-arm64-")).resolve()
    site = product_site(out)
    guest_env = {"PATH": GUEST_PATH, "PYTHONPATH": str(site), "HOME": "/root", "LANG": "C.UTF-8",
                 "GNI_OUT": str(out), "GNI_KERNEL_RELEASE": kernel.release,
                 "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    guest._write_bookkeeping(out, script, guest_env, Path("/"))
    return guest.boot_and_collect(_qemu_command(kernel, out, cmdline, memory_mb), out, timeout)


def real_nvidia_ko() -> Path:
    """NVIDIA's real 535 nvidia.ko (the open flavour, what Grace and Blackwell take),
    cross-built by `package build` for bookworm's arm64 release (minutes cold; arm64cross
    caches it keyed by its inputs)."""
    pkg = cross_package("open") / "pkg"
    found = sorted(pkg.rglob("nvidia.ko"))
    if len(found) != 1:
        raise AssetError(f"{pkg} holds {len(found)} nvidia.ko; delete it to rebuild")
    return found[0]


def ensure_all() -> Kernel:
    """Everything the arm64 guest needs, for `python -m tests.kernel.arm64` (timed)."""
    started = time.monotonic()
    kernel = ensure_kernel()
    guest.ensure_initramfs(kernel, ensure_busybox())
    ensure_rootfs(kernel)
    product_wheel()
    log(f"arm64 guest assets ready in {time.monotonic() - started:.1f}s")
    return kernel


if __name__ == "__main__":
    print(ensure_all().root)
