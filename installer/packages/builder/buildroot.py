"""Compile in a root filesystem of the kernel's distro (`package build --build-root`).

A kernel's modules must be built with that kernel's compiler, and its kbuild tools
(`linux-kbuild-X.Y`) are linked against that distro's glibc: trixie's 6.12 headers need
gcc-14 and glibc >= 2.38, which a bookworm host lacks. So make runs under `chroot ROOT`, in a
private mount namespace (`unshare --mount`) where the compile's work dir is bind-mounted at
the same path it has outside (so every path, prefix map and Makefile include stays valid and
nothing recorded in the modules depends on where ROOT is), with a fresh tmpfs on ROOT's /tmp
and /dev (null, zero, random, urandom only): nothing of the host but the work dir is visible,
and every mount vanishes with the process.

`--build-root auto` makes the root itself with `mmdebstrap --variant=minbase` for the Debian
suite the kernel's compiler names (gcc-12 -> bookworm, gcc-14 -> trixie), once per suite and
package list, under `<cache>/build-roots/` (built in a temp dir, renamed into place).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.packages.builder.headers import KernelTree
from installer.packages.builder.inputs import PackageBuildError

AUTO = "auto"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "GNI_DEBIAN_MIRROR"
CACHE_ENV = "GNI_BUILD_ROOT_CACHE"
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The Debian suite whose default compiler built the kernel, and what its linux-kbuild package
# depends on: the libraries its tools link (renamed by the 64-bit time_t transition) and, in
# trixie, pahole (6.12's modfinal runs it for BTF; missing, the link step exits 127).
SUITES = {"12": "bookworm", "14": "trixie"}
_KBUILD_DEPS = {"bookworm": ("libelf1", "libssl3"),
                "trixie": ("libelf1t64", "libssl3t64", "zlib1g", "pahole")}
_GCC_RE = re.compile(r"^gcc-(\d+)(?:-[a-z0-9_]+-linux-gnu)?$")  # its package (or cross's)
_MOUNT_SCRIPT = r"""set -e
root=$1; work=$2; shift 2
mount -t tmpfs -o mode=1777 gni-tmp "$root/tmp"
mount -t tmpfs -o mode=755 gni-dev "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3; mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/random" c 1 8; mknod -m 666 "$root/dev/urandom" c 1 9
mkdir -p "$root$work"
mount --bind "$work" "$root$work"
exec chroot "$root" "$@"
"""


@dataclass(frozen=True)
class BuildRoot:
    """A checked root: where it is, the compiler's path inside it, what it is (provenance)."""

    path: Path
    compiler: str
    provenance: dict[str, str]

    def command(self, work: Path, cmd: list[str]) -> list[str]:
        """`cmd` run under chroot in a private mount namespace with `work` visible."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_SCRIPT,
                "sh", str(self.path), str(work), *cmd]

    def mount_point(self, work: Path) -> list[Path]:
        """Make the dirs `work` is bind-mounted on (none under /tmp: that is a tmpfs there);
        returns the ones made, deepest first, for `cleanup`."""
        if work.is_relative_to("/tmp"):
            return []
        inside = self.path / work.relative_to("/")
        steps = [p for p in [inside, *inside.parents] if p.is_relative_to(self.path)]
        crossing = [p for p in steps if p.is_symlink()]  # would lead out of the root
        if crossing:
            raise PackageBuildError(
                f"the build's work dir {work} would be mounted across the link {crossing[-1]}"
                " in the build root", remedy="set TMPDIR to a directory under /tmp")
        made = [p for p in steps if not p.exists()]
        inside.mkdir(parents=True, exist_ok=True)
        return made

    @staticmethod
    def cleanup(made: list[Path]) -> None:
        """Remove the (empty) mount-point dirs `mount_point` made, and no others."""
        for path in made:
            try:
                path.rmdir()
            except OSError:
                break


def check_privileges() -> None:
    """chroot and mount need root: refuse before any work instead of failing in make."""
    if os.geteuid() != 0:
        raise PackageBuildError(
            "--build-root needs root (chroot and a private mount namespace)",
            remedy="run package build as root (sudo), or build on a host of the kernel's "
                   "distro without --build-root")
    for tool, package in (("unshare", "util-linux"), ("chroot", "coreutils"),
                          ("mount", "mount")):
        if shutil.which(tool) is None:
            raise PackageBuildError(f"{tool} not found (needed for --build-root)",
                                    remedy=f"apt-get install {package}")


def suite_for(kernel: KernelTree) -> str:
    """The Debian suite whose gcc built this kernel (from CONFIG_CC_VERSION_TEXT)."""
    text = kernel.cc_version_text
    gcc = _GCC_RE.match(kernel.compiler_package)
    suite = SUITES.get(gcc[1]) if gcc and "Debian" in text else None
    if suite is None:
        raise PackageBuildError(
            f"--build-root auto knows no Debian suite for kernel {kernel.release}, built with "
            f"{text or 'an unknown compiler'}",
            remedy="make a root of the kernel's distro by hand (docs/building-packages.md, "
                   "'--build-root') and pass --build-root DIR")
    return suite


def packages_for(kernel: KernelTree, suite: str) -> tuple[str, ...]:
    """What a root needs to compile modules: the kernel's gcc, make, libc headers, and what
    the kernel's kbuild tools need."""
    return (kernel.compiler_package, "make", "libc6-dev", "xz-utils", *_KBUILD_DEPS[suite])


def resolve(spec: str, kernel: KernelTree, cache: Path | None, mirror: str | None,
            log: Any) -> BuildRoot:
    """`--build-root DIR` checked, or `auto` made (or reused from the cache)."""
    check_privileges()
    if spec != AUTO:
        return open_root(Path(spec), kernel)
    suite = suite_for(kernel)
    packages = packages_for(kernel, suite)
    path = ensure_auto_root(suite, packages, cache or default_cache(),
                            mirror or os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR, log)
    return open_root(path, kernel)


def open_root(path: Path, kernel: KernelTree) -> BuildRoot:
    """Check that `path` is a root that can compile for `kernel`."""
    if not path.is_dir():
        raise PackageBuildError(f"--build-root {path} does not exist",
                                remedy="make one (docs/building-packages.md: mmdebstrap), or pass "
                                       "--build-root auto")
    path = path.resolve()
    if path == Path("/"):
        raise PackageBuildError("--build-root / is the host itself",
                                remedy="build without --build-root, or give another root")
    missing = [d for d in ("usr/bin", "tmp", "dev", "etc")
               if not (path / d).is_dir() or ((path / d).is_symlink() and d != "usr/bin")]
    if missing:
        raise PackageBuildError(f"--build-root {path} is not a root filesystem (no "
                                f"{', '.join(missing)})",
                                remedy="give a directory made by mmdebstrap or debootstrap, "
                                       "or --build-root auto")
    for tool in (kernel.compiler, "make"):
        if not os.path.lexists(path / "usr" / "bin" / tool):
            raise PackageBuildError(
                f"{tool} not found in build root {path}: kernel {kernel.release} was built "
                f"with {kernel.cc_version_text or kernel.compiler}",
                remedy=f"install it in the root (chroot {path} apt-get install "
                       f"{kernel.compiler_package if tool != 'make' else 'make'}), or use "
                       "--build-root auto")
    return BuildRoot(path, f"/usr/bin/{kernel.compiler}", _describe(path, kernel.compiler_package))


def _describe(root: Path, compiler: str) -> dict[str, str]:
    """Provenance: the root's distro and suite, and its compiler package's version."""
    release = {}
    os_release = root / "etc" / "os-release"
    if os_release.is_file():
        for line in os_release.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            release[key] = value.strip().strip('"')
    version = ""
    status = root / "var" / "lib" / "dpkg" / "status"
    if status.is_file():
        found = re.search(rf"^Package: {re.escape(compiler)}\n(?:[^\n]+\n)*?Version: (\S+)",
                          status.read_text(errors="replace"), re.M)
        version = found[1] if found else ""
    suite = release.get("VERSION_CODENAME", "")
    return {"distro": release.get("ID", "unknown")[:64], "suite": suite[:64],
            "compiler": f"{compiler} {version}".strip()[:128]}


def default_cache() -> Path:
    """`$GNI_BUILD_ROOT_CACHE`, else `$XDG_CACHE_HOME/gpu-node-installer/build-roots`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpu-node-installer" / "build-roots"


def ensure_auto_root(suite: str, packages: tuple[str, ...], cache: Path, mirror: str,
                     log: Any) -> Path:
    """The cached root for (suite, packages), made with mmdebstrap the first time."""
    key = hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:12]
    final = cache / f"debian-{suite}-{key}"
    if (final / "usr" / "bin").is_dir():
        return final
    if shutil.which("mmdebstrap") is None:
        raise PackageBuildError("--build-root auto needs mmdebstrap, which is not installed",
                                remedy="apt-get install mmdebstrap, or make a root by hand "
                                       "and pass --build-root DIR")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build waits and reuses the first's root
        if (final / "usr" / "bin").is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache))
        try:
            _mmdebstrap(suite, packages, tmp, mirror, log)
            tmp.chmod(0o755)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _mmdebstrap(suite: str, packages: tuple[str, ...], dest: Path, mirror: str,
                log: Any) -> None:
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
           f"--include={','.join(packages)}", suite, str(dest), mirror]
    log.info("making build root", suite=suite, packages=list(packages), mirror=mirror)
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if ln.startswith("E:")),
                    lines[-1] if lines else "?")
        raise PackageBuildError(f"mmdebstrap {suite} failed: {last.strip()[:300]}",
                                remedy=f"check the mirror ({mirror}; set {MIRROR_ENV} or "
                                       "--debian-mirror) and the network")
    log.info("build root made", suite=suite, elapsed_s=round(time.monotonic() - started, 1))
