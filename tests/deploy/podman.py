"""A real image build for the deploy tests: a Debian bookworm rootfs from mmdebstrap (cached),
imported as a local base image, and the project's Dockerfile built on it with podman.

No registry is reachable here, so nothing is pulled: the base is imported, builds run with
`--pull=never`. Flags this machine needs (see docs/deploy.md, "Building the image"): chroot
isolation for RUN steps, cgroupfs and file events (no systemd), runc, and rlimits within the
session's own hard limits (podman's default RLIMIT_NPROC is above them and runc then fails).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.manifests import REPO

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


def base_image() -> tuple[str, float | None, float | None]:
    """The local bookworm base (python3 + venv): cached tarball, imported once per store."""
    key = hashlib.sha256("\0".join(MMDEBSTRAP).encode()).hexdigest()[:12]
    tag = f"localhost/gni-test-base:bookworm-{key}"
    tarball = CACHE / f"base-bookworm-{key}.tar"
    rootfs_s = import_s = None
    if not tarball.exists():
        if shutil.which("mmdebstrap") is None:
            raise AssertionError("mmdebstrap is missing: run scripts/install-deps.sh as root")
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial.tar")
        started = time.monotonic()
        proc = subprocess.run(["mmdebstrap", *MMDEBSTRAP, str(partial)], capture_output=True,
                              text=True, timeout=900, check=False)
        assert proc.returncode == 0, f"mmdebstrap failed:\n{proc.stderr[-4000:]}"
        partial.rename(tarball)
        rootfs_s = time.monotonic() - started
    if podman("image", "exists", tag, check=False).returncode != 0:
        started = time.monotonic()
        podman("import", "--change", "CMD [\"/bin/sh\"]", str(tarball), tag, timeout=300)
        import_s = time.monotonic() - started
    return tag, rootfs_s, import_s


def build_context(target: Path, preloaded: dict[str, str]) -> Path:
    """What the Dockerfile needs from the repository, plus files for the preloaded dir."""
    target.mkdir(parents=True)
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)
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
