"""A real image build for the deploy tests: a Debian bookworm rootfs from mmdebstrap (cached),
imported as a local base image, and the project's Dockerfile built on it with podman.

No registry is reachable here, so nothing is pulled: the base is imported, builds run with
`--pull=never`. Flags this machine needs (see docs/image.md): chroot
isolation for RUN steps, cgroupfs and file events (no systemd), runc, and rlimits within the
session's own hard limits (podman's default RLIMIT_NPROC is above them and runc then fails).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.manifests import REPO
from installer import __version__

CACHE = Path(os.environ.get("GNI_TEST_CACHE",
                            Path.home() / ".cache" / "gpu-node-installer-test")) / "deploy"
MMDEBSTRAP = (
    "--variant=minbase", "--include=python3,python3-venv",
    "--aptopt=Acquire::Retries \"3\"",
    "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "bookworm",
)
GLOBAL = ("--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime", "runc")
# The image the image tier builds (test_image.py, test_push.py): the same context gives the
# same layers, so the second build in a session is podman's cache.
PROJECT_TAG = f"localhost/gpu-node-installer:test-{__version__}"
PROJECT_PRELOADED = {"preloaded-by-test.txt": "baked into the image\n"}
RUN = ("--rm", "--network", "none", "--ulimit", "nofile=20000:20000",
       "--ulimit", "nproc=4096:4096")


def podman(*args: str, timeout: float = 120, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *GLOBAL, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def run(image: str, *args: str, entrypoint: str | None = None, volumes: tuple[str, ...] = (),
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """`podman run` with this machine's flags, no network, read-only bind mounts."""
    extra: list[str] = []
    for volume in volumes:
        extra += ["-v", volume]
    if entrypoint is not None:
        extra += ["--entrypoint", entrypoint]
    return podman("run", *RUN, *extra, image, *args, check=check)


def why_podman_cannot_run() -> str | None:
    """None when podman exists and answers; else the reason (for a skip message)."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/install-deps.sh installs it as root)"
    proc = subprocess.run(["podman", *GLOBAL, "info"], capture_output=True, text=True,
                          timeout=120, check=False)
    if proc.returncode != 0:
        return f"podman cannot run here: {proc.stderr.strip()[-500:]}"
    return None


@dataclass(frozen=True)
class Timings:
    rootfs_s: float | None  # None: taken from the cache
    import_s: float | None
    build_s: float


NATIVE = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
QEMU = {"amd64": "x86_64", "arm64": "aarch64"}  # Debian arch -> qemu-user's binfmt name


def why_arch_cannot_run(arch: str) -> str | None:
    """None when this machine runs `arch` binaries (natively, or through qemu-user's binfmt
    handler, which the tests use but never register: scripts/install-deps.sh does, once)."""
    if arch == NATIVE:
        return None
    handler = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{QEMU.get(arch, arch)}"
    try:
        enabled = handler.read_text().splitlines()[0] == "enabled"
    except (OSError, IndexError):
        return (f"no binfmt handler for {arch} ({handler} is missing): install "
                "qemu-user-static and binfmt-support (scripts/install-deps.sh as root)")
    return None if enabled else f"the binfmt handler {handler} is disabled"


def base_tarball(arch: str = NATIVE) -> tuple[Path, str, float | None]:
    """The bookworm rootfs tarball for `arch` (mmdebstrap, cached; tests/prefetch.py makes it
    ahead): (its path, its image tag, seconds it took when made now). The native arch keeps
    the arguments (and cache key) it always had; a foreign one is made by mmdebstrap through
    qemu-user (its maintainer scripts are the target's code)."""
    args = MMDEBSTRAP if arch == NATIVE else (f"--architectures={arch}", *MMDEBSTRAP)
    key = hashlib.sha256("\0".join(args).encode()).hexdigest()[:12]
    name = "bookworm" if arch == NATIVE else f"bookworm-{arch}"
    tarball = CACHE / f"base-{name}-{key}.tar"
    rootfs_s = None
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{tarball.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker; the others wait and take its tarball
        if not tarball.exists():
            if shutil.which("mmdebstrap") is None:
                raise AssertionError("mmdebstrap is missing: run scripts/install-deps.sh as root")
            partial = tarball.with_suffix(".partial.tar")
            started = time.monotonic()
            proc = subprocess.run(["mmdebstrap", *args, str(partial)], capture_output=True,
                                  text=True, timeout=1800, check=False)
            assert proc.returncode == 0, f"mmdebstrap failed:\n{proc.stderr[-4000:]}"
            partial.rename(tarball)
            rootfs_s = time.monotonic() - started
    return tarball, f"localhost/gni-test-base:{name}-{key}", rootfs_s


def base_image(arch: str = NATIVE) -> tuple[str, float | None, float | None]:
    """The local bookworm base (python3 + venv) for `arch`: the cached tarball, imported once
    per store. Returns (tag, seconds mmdebstrap took now, seconds the import took now)."""
    tarball, tag, rootfs_s = base_tarball(arch)
    import_s = None
    if podman("image", "exists", tag, check=False).returncode != 0:
        started = time.monotonic()
        podman("import", "--arch", arch, "--change", "CMD [\"/bin/sh\"]", str(tarball), tag,
               timeout=300)
        import_s = time.monotonic() - started
    return tag, rootfs_s, import_s


def manifest_list(name: str, images: list[str]) -> str:
    """A local manifest list of `images` (one per platform), made afresh: what a multi-arch
    FROM resolves per platform, as a registry's list would."""
    if podman("manifest", "exists", name, check=False).returncode == 0:
        podman("manifest", "rm", name)
    podman("manifest", "create", name)
    for image in images:
        podman("manifest", "add", name, f"containers-storage:{image}")
    return name


def build_context(target: Path, preloaded: dict[str, str]) -> Path:
    """What the Dockerfile needs from the repository, plus files for the preloaded dir."""
    target.mkdir(parents=True)
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)
    (target / "requirements").mkdir()
    for name in ("runtime.txt", "sbom.txt"):
        shutil.copy2(REPO / "requirements" / name, target / "requirements" / name)
    shutil.copytree(REPO / "installer", target / "installer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(REPO / "daemonset" / "preloaded", target / "daemonset" / "preloaded")
    for name, text in preloaded.items():
        (target / "daemonset" / "preloaded" / name).write_text(text)
    return target


def ca_bundle() -> str | None:
    """The CA the index is verified with here (a proxy's, in this workplace), if any."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        path = os.environ.get(name)
        if path and Path(path).is_file():
            return path
    system = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's, local CAs included
    return str(system) if system.is_file() else None


def build(context: Path, base: str, tag: str, version: str) -> float:
    """`podman build` of the project's Dockerfile on the local base; returns seconds."""
    secret = ca_bundle()
    args = ["build", "--isolation", "chroot", "--pull=never", "--network", "host",
            "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"VERSION={version}",
            "-t", tag]
    if secret:
        args += ["--secret", f"id=pip-ca,src={secret}"]
    started = time.monotonic()
    podman(*args, str(context), timeout=900)
    return time.monotonic() - started


def project_image(tmp_path_factory: pytest.TempPathFactory, tag: str = PROJECT_TAG,
                  preloaded: dict[str, str] | None = None) -> str:
    """The project's image built from the local base (skips where podman cannot run
    containers); timings go to stderr."""
    reason = why_podman_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    base, rootfs_s, import_s = base_image()
    probe = run(base, "true", check=False)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {probe.stderr.strip()[-500:]}")
    context = build_context(tmp_path_factory.mktemp("image") / "context",
                            PROJECT_PRELOADED if preloaded is None else preloaded)
    with open(CACHE / ".project-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder (another worker) waits, then
        build_s = build(context, base, tag, __version__)  # finds every layer cached

    def seconds(value: float | None) -> str:
        return "cached" if value is None else f"{value:.1f} s"

    print(f"\nimage timings: rootfs {seconds(rootfs_s)}, import {seconds(import_s)}, "
          f"build {seconds(build_s)}", file=sys.stderr)
    return tag
