"""Fetch, build and cache the real-kernel tier's assets outside the repo, keyed by version."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .apt import Apt, AssetError, apt, cache_root, log, run

__all__ = ["AssetError", "Kernel", "apt", "cache_root", "log", "run"]

NVIDIA_REAL_VERSION = "535.261.03"
# What a GPU node loads (nvidia-peermem needs Mellanox's stack). nvidia-uvm is most of the
# ~4 min cold build; package-build tests need the whole set.
NVIDIA_REAL_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
TEST_MODULE_VERSIONS = ("535.261.03", "550.54.14")
MODULES_SRC = Path(__file__).resolve().parent / "modules"
# Kernel modules the guest's initramfs needs to mount the host over 9p (+ overlay).
GUEST_BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Serialise builders of one asset (parallel test runs, two CI jobs on one box)."""
    lock_dir = cache_root() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """Build into a sibling temp dir and rename it into place only when complete."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it 0700; other users (and the guest) read it
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- the kernel ------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """An extracted Debian kernel: vmlinuz plus its modules tree with modules.dep."""

    release: str
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "image" / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "image" / "lib" / "modules" / self.release

    @property
    def headers(self) -> Path:
        """SYSOUT: the arch-specific headers dir (Makefile patched to the extracted common)."""
        return self.root / "headers" / "usr" / "src" / f"linux-headers-{self.release}"

    @property
    def headers_common(self) -> Path:
        common = self.release.rsplit("-", 1)[0] + "-common"
        return self.root / "headers" / "usr" / "src" / f"linux-headers-{common}"


def kernel_release() -> str:
    """The release bookworm's linux-image-amd64 points at now (or GNI_TEST_KERNEL_RELEASE)."""
    return linked_release(apt(), "GNI_TEST_KERNEL_RELEASE")


def linked_release(index: Apt, pin_variable: str) -> str:
    """The release an index's linux-image-amd64 depends on, unless `pin_variable` pins one."""
    pinned = os.environ.get(pin_variable)
    if pinned:
        return pinned
    out = index.query("depends", "linux-image-amd64")
    m = re.search(r"Depends: linux-image-(\d\S*-amd64)$", out, re.M)
    if not m:
        raise AssetError(f"cannot tell which kernel linux-image-amd64 depends on:\n{out}")
    return m[1]


def ensure_kernel(release: str, source: Apt | None = None) -> Kernel:
    """Download and extract linux-image-<release>, then depmod its tree (Debian's postinst does).

    `source`: another distro's apt (default: the machine's bookworm)."""
    kernel = Kernel(release, cache_root() / "kernel" / release)
    image = kernel.root / "image"
    with locked(f"image-{release}"):
        if not image.is_dir():
            log(f"fetching linux-image-{release}")
            with staging(image) as tmp:
                (source or apt()).download_extract(f"linux-image-{release}", tmp)
                if (tmp / "usr" / "lib" / "modules").is_dir() and not (tmp / "lib").exists():
                    (tmp / "lib").symlink_to("usr/lib")  # trixie ships merged-/usr paths
                run(["depmod", "-b", str(tmp), release])
        if not kernel.vmlinuz.is_file() or not (kernel.modules_dir / "modules.dep").is_file():
            raise AssetError(f"{image} is incomplete; delete it to refetch")
    return kernel


def ensure_headers(kernel: Kernel) -> Kernel:
    """Extract linux-headers-<release>, -common and the matching linux-kbuild package."""
    dest = kernel.root / "headers"
    with locked(f"headers-{kernel.release}"):
        if not dest.is_dir():
            pkg = f"linux-headers-{kernel.release}"
            a = apt()
            version = a.version(pkg)
            common = kernel.release.rsplit("-", 1)[0] + "-common"
            kbuild = "linux-kbuild-" + ".".join(kernel.release.split(".")[:2])
            log(f"fetching {pkg} {version}")
            with staging(dest) as tmp:
                for spec in (pkg, f"linux-headers-{common}={version}", f"{kbuild}={version}"):
                    a.download_extract(spec, tmp)
                # the include must name where the tree ends up, not the staging dir
                makefile = tmp / "usr" / "src" / pkg / "Makefile"
                _patch_headers_makefile(makefile, dest / "usr" / "src")
    return kernel


def _patch_headers_makefile(makefile: Path, src: Path) -> None:
    """Debian's arch Makefile includes /usr/src/...-common by absolute path; point it here."""
    text = makefile.read_text()
    makefile.write_text(text.replace("include /usr/src/", f"include {src}/"))


def ensure_debs(name: str, specs: list[str], source: Apt | None = None) -> list[Path]:
    """The .deb files themselves (downloaded, never installed), cached under `kernel-debs/`."""
    dest = cache_root() / "kernel-debs" / name
    with locked(f"kernel-debs-{name}"):
        if not dest.is_dir():
            log(f"downloading {', '.join(specs)}")
            with staging(dest) as tmp:
                (source or apt()).download(specs, tmp)
    debs = sorted(dest.glob("*.deb"))
    if len(debs) != len(specs):
        raise AssetError(f"{dest} holds {len(debs)} .debs, not {len(specs)}; delete it to refetch")
    return debs


def headers_debs(kernel: Kernel, source: Apt | None = None) -> list[Path]:
    """linux-headers-<release>, its -common and linux-kbuild as .deb files, cached."""
    return release_headers_debs(kernel.release, source)


def release_headers_debs(release: str, source: Apt | None = None) -> list[Path]:
    """The three headers .debs of any release the index has (an older 6.1.0-N too); trixie
    names its kbuild package per ABI (linux-kbuild-6.12.117+deb13)."""
    a = source or apt()
    pkg = f"linux-headers-{release}"
    version = a.version(pkg)
    abi = release.rsplit("-", 1)[0]
    kbuild = "linux-kbuild-" + (abi if "+deb" in abi else ".".join(release.split(".")[:2]))
    # linux-kbuild-X.Y is shared by every ABI: the archive keeps only its newest builds,
    # so an older release takes the newest one of its upstream version
    kbuilds = a.versions(kbuild)
    upstream = version.split("-")[0]
    kversion = version if version in kbuilds else next(
        (v for v in kbuilds if v.split("-")[0] == upstream), version)
    return ensure_debs(f"headers-{release}-{version}",
                       [f"{pkg}={version}", f"linux-headers-{abi}-common={version}",
                        f"{kbuild}={kversion}"], source)


def nvidia_source_deb(name: str = "nvidia-kernel-source") -> Path:
    """Debian's nvidia-kernel-source .deb (non-free; `nvidia-open-kernel-source`: contrib) of
    the tier's pinned NVIDIA version."""
    a = apt()
    matching = [v for v in a.versions(name) if v.startswith(NVIDIA_REAL_VERSION)]
    if not matching:
        raise AssetError(f"no {name} {NVIDIA_REAL_VERSION} in Debian bookworm")
    return ensure_debs(f"{name}-{matching[0]}", [f"{name}={matching[0]}"])[0]


# --- modules ---------------------------------------------------------------------------


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def build_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    return env


def check_toolchain(kernel: Kernel) -> None:
    """Fail with the package to install rather than a cryptic make error."""
    makefile = (kernel.headers / ".kernelvariables").read_text() if kernel.headers.is_dir() else ""
    m = re.search(r"\)gcc-(\d+)", makefile)
    gcc = f"gcc-{m[1]}" if m else "gcc"
    for tool, package in (("make", "make"), (gcc, gcc), ("depmod", "kmod")):
        if shutil.which(tool) is None:
            raise AssetError(f"{tool} not found: apt-get install {package}")


def build_test_modules(kernel: Kernel, version: str, flavour: str = "proprietary") -> Path:
    """Build the stand-in nvidia*.ko from tests/kernel/modules for one driver version.

    `flavour="open"` makes their NVRM version line read like NVIDIA's open modules.
    """
    ensure_headers(kernel)
    suffix = "" if flavour == "proprietary" else f"-{flavour}"
    out = kernel.root / "test-modules" / f"{version}{suffix}-{_tree_digest(MODULES_SRC)}"
    with locked(f"test-modules-{kernel.release}-{version}{suffix}"):
        if out.is_dir():
            return out
        check_toolchain(kernel)
        log(f"building test modules {version}")
        with staging(out) as tmp:
            build = tmp / "build"
            shutil.copytree(MODULES_SRC, build)
            cmd = ["make", "-C", str(kernel.headers), f"M={build}", f"NV_VERSION={version}",
                   f"NV_FLAVOUR={flavour}"]
            run([*cmd, "-j2", "modules"], env=build_env())
            for ko in build.glob("*.ko"):
                shutil.copy2(ko, tmp / ko.name)
            shutil.rmtree(build)
    return out


def build_key(inputs: list[Path], extra: bytes = b"") -> str:
    """The key of a cached package: the inputs' bytes, the compilers' versions, `extra` (flags,
    patches) and the product's build code. Which of these a compile depends on is the
    product's own compile cache's business (`--compile-cache`, COMPILED): a change to how
    packages are written re-packages here in seconds, and compiles again only when what
    shapes the modules' bytes changed."""
    code = sorted((Path(__file__).resolve().parents[2] / "installer" / "packages" / "builder"
                   ).glob("*.py"))
    return hashlib.sha256(b"".join(hashlib.sha256(p.read_bytes()).digest()
                                   for p in [*inputs, *code]) + compilers() + extra
                          ).hexdigest()[:16]


@functools.cache
def compilers() -> bytes:
    """The first `--version` line of each compiler the tier's builds use (those present)."""
    lines = []
    for name in ("gcc-12", "aarch64-linux-gnu-gcc-12"):
        path = shutil.which(name)
        if path:
            done = subprocess.run([path, "--version"], capture_output=True, text=True,
                                  check=False, timeout=30)
            lines.append(f"{name}: {(done.stdout.splitlines() or [''])[0]}")
    return "\n".join(lines).encode()


def compile_cache() -> str:
    """`package build --compile-cache` for the tier's cached builds: the product keeps each
    compile by what shapes its bytes, so a new package key re-packages without make."""
    return f"--compile-cache={cache_root() / 'compiled'}"


def build_nvidia_cli(kernel: Kernel) -> Path:
    """A package of NVIDIA's real 535 modules compiled by `gpu-node-installer package build
    --nvidia-source ... --kernel-headers ...` (the CLI, in a subprocess; minutes cold).

    Cached under the kernel's dir, keyed by the digests of the source and headers .debs and
    of the product's compile code (a change to how modules are compiled compiles again).
    Returns the package directory (its `modules/` holds the .ko files).
    """
    source = nvidia_source_deb()
    headers = headers_debs(kernel)
    out = kernel.root / f"nvidia-cli-{build_key([source, *headers])}"
    with locked(f"nvidia-cli-{kernel.release}"):
        if out.is_dir():
            return out / "pkg"
        log(f"compiling NVIDIA {source.name} with package build (minutes)")
        with staging(out) as tmp:
            cmd = [sys.executable, "-m", "installer", "package", "build",
                   f"--nvidia-source={source}", *(f"--kernel-headers={h}" for h in headers),
                   f"--out-dir={tmp / 'pkg'}", compile_cache()]
            started = time.monotonic()
            output = run(cmd, env=build_env())
            (tmp / "build.log").write_text(output)
            (tmp / "seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    return out / "pkg"


def ensure_busybox() -> Path:
    """A static busybox for the guest's initramfs, from Debian's busybox-static (extracted)."""
    a = apt()
    version = a.version("busybox-static")
    dest = cache_root() / "busybox" / version
    with locked("busybox"):
        if not dest.is_dir():
            log(f"fetching busybox-static {version}")
            with staging(dest) as tmp:
                a.download_extract(f"busybox-static={version}", tmp)
    return dest / "bin" / "busybox"


def ensure_all(*, real_nvidia: bool = True) -> Kernel:
    """Everything the tier needs, for `python -m tests.kernel.assets` and the fixtures."""
    kernel = ensure_headers(ensure_kernel(kernel_release()))
    ensure_busybox()
    for version in TEST_MODULE_VERSIONS:
        build_test_modules(kernel, version)
    if real_nvidia:
        build_nvidia_cli(kernel)
    return kernel


if __name__ == "__main__":
    k = ensure_all(real_nvidia="--no-real-nvidia" not in sys.argv)
    print(k.root)
