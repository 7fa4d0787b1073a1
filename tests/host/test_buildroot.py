"""`package build --build-root DIR|auto`: every bad build root refused before make runs.

The CLI runs in a subprocess (its real exit code and stderr); each refusal is one line, exit
2, nothing published. Nothing here compiles or runs mmdebstrap: the real compile in a
trixie root is tests/kernel/test_buildroot_real.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvsources import fake_headers, mini_source, refused_build

RELEASE = "6.12.117+deb13-amd64"
TRIXIE_CC = "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0"
CLI = (sys.executable, "-m", "installer")


_refused = refused_build


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    source = mini_source(tmp_path / "nvidia-src")
    headers = fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE, cc_text=TRIXIE_CC)
    return f"--nvidia-source={source}", f"--kernel-headers={headers}"


def _root(path: Path, *tools: str) -> Path:
    for sub in ("usr/bin", "tmp", "dev", "etc"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (path / "usr" / "bin" / tool).write_text("#!/bin/sh\n")
    return path


def test_missing_build_root(tmp_path: Path, inputs: tuple[str, str]) -> None:
    line = _refused(tmp_path / "out", *inputs, f"--build-root={tmp_path / 'nowhere'}")
    assert "--build-root" in line and "does not exist" in line
    assert "--build-root auto" in line


def test_a_directory_that_is_not_a_root(tmp_path: Path, inputs: tuple[str, str]) -> None:
    (tmp_path / "empty").mkdir()
    line = _refused(tmp_path / "out", *inputs, f"--build-root={tmp_path / 'empty'}")
    assert "is not a root filesystem (no usr/bin, tmp, dev, etc)" in line


def test_root_without_the_kernels_compiler_names_the_package(tmp_path: Path,
                                                              inputs: tuple[str, str]) -> None:
    root = _root(tmp_path / "root", "make", "gcc-12")  # a bookworm root for a trixie kernel
    line = _refused(tmp_path / "out", *inputs, f"--build-root={root}")
    assert f"x86_64-linux-gnu-gcc-14 not found in build root {root}" in line
    assert TRIXIE_CC in line and f"chroot {root} apt-get install gcc-14" in line


def test_root_without_make(tmp_path: Path, inputs: tuple[str, str]) -> None:
    root = _root(tmp_path / "root", "x86_64-linux-gnu-gcc-14")
    line = _refused(tmp_path / "out", *inputs, f"--build-root={root}")
    assert "make not found in build root" in line and "apt-get install make" in line


def test_host_without_the_compiler_suggests_a_build_root(tmp_path: Path,
                                                         inputs: tuple[str, str]) -> None:
    line = _refused(tmp_path / "out", *inputs)
    assert "x86_64-linux-gnu-gcc-14 not found" in line
    assert line.endswith("fix: apt-get install gcc-14, or compile in a root of the kernel's "
                         "distro: --build-root auto")


def test_auto_without_mmdebstrap(tmp_path: Path, inputs: tuple[str, str]) -> None:
    bin_dir = tmp_path / "bin"  # the tools chroot needs, but no mmdebstrap
    bin_dir.mkdir()
    for tool in ("unshare", "chroot", "mount"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    line = _refused(tmp_path / "out", *inputs, "--build-root=auto",
                    f"--build-root-cache={tmp_path / 'cache'}", env={"PATH": str(bin_dir)})
    assert "--build-root auto needs mmdebstrap" in line
    assert "apt-get install mmdebstrap" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_auto_for_a_kernel_of_no_known_debian_suite(tmp_path: Path) -> None:
    source = mini_source(tmp_path / "nvidia-src")
    headers = fake_headers(tmp_path / "linux-headers-6.8.0-1-generic", "6.8.0-1-generic",
                           cc_text="x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0")
    line = _refused(tmp_path / "out", f"--nvidia-source={source}",
                    f"--kernel-headers={headers}", "--build-root=auto",
                    f"--build-root-cache={tmp_path / 'cache'}")
    assert "knows no Debian suite for kernel 6.8.0-1-generic" in line
    assert "pass --build-root DIR" in line


def test_build_root_needs_nvidia_source(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    line = _refused(tmp_path / "out", f"--modules={tmp_path / 'm'}", "--build-root=auto")
    assert "--build-root needs --nvidia-source" in line


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temp dir an unprivileged user can read (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gni-buildroot-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to drop to nobody")
def test_not_root_is_refused_with_the_remedy(shared_dir: Path) -> None:
    source = mini_source(shared_dir / "nvidia-src")
    headers = fake_headers(shared_dir / f"linux-headers-{RELEASE}", RELEASE, cc_text=TRIXIE_CC)
    line = _refused(shared_dir / "out", f"--nvidia-source={source}",
                    f"--kernel-headers={headers}", "--build-root=auto",
                    prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
                    env={"HOME": str(shared_dir)})
    assert "--build-root needs root (chroot and a private mount namespace)" in line
    assert "run package build as root" in line


def _shell_root(path: Path, make_script: str) -> Path:
    """A tiny real root: the host's dash (and the libraries ldd names) as /bin/sh, a shell
    script as make, a placeholder compiler. Enough for chroot to run make, nothing else."""
    _root(path, "x86_64-linux-gnu-gcc-14")
    dash = Path(shutil.which("dash") or "/bin/dash").resolve()
    libs = subprocess.run(["ldd", str(dash)], capture_output=True, text=True, check=True).stdout
    for found in [dash, *(Path(w) for w in libs.split() if w.startswith("/"))]:
        target = path / str(found).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(found.resolve(), target)
    (path / "bin").mkdir(exist_ok=True)
    shutil.copy(dash, path / "bin" / "sh")
    make = path / "usr" / "bin" / "make"
    make.write_text(make_script)
    make.chmod(0o755)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_make_runs_under_chroot_seeing_only_the_work_dir(tmp_path: Path,
                                                          inputs: tuple[str, str]) -> None:
    """make (a script here) runs in the root: the build dir is at its own path, the host's
    files are not there, and a tool missing there is named in the one error line."""
    script = ('#!/bin/sh\n[ -d "$2" ] && [ ! -e /usr/bin/python3 ] '
              '&& echo "/bin/sh: 1: pahole: not found" || echo "error: wrong view"\nexit 2\n')
    root = _shell_root(tmp_path / "root", script)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    done = subprocess.run([*CLI, "package", "build", *inputs, f"--build-root={root}",
                           f"--out-dir={tmp_path / 'out'}"], capture_output=True, text=True,
                          timeout=120, check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "make exited 2: pahole not found" in errors[0]
    assert not (tmp_path / "out").exists()
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # left as found


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_work_dir_path_crossing_a_link_in_the_root_is_refused(
        tmp_path: Path, inputs: tuple[str, str]) -> None:
    """A work dir outside /tmp is mounted at its own path in the root; a link on that path
    (var -> elsewhere) would create dirs outside the root, so it is refused first."""
    root = _root(tmp_path / "root", "x86_64-linux-gnu-gcc-14", "make")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "var").symlink_to(elsewhere)
    work = Path(tempfile.mkdtemp(prefix="gni-work-", dir="/var/tmp"))
    try:
        line = _refused(tmp_path / "out", *inputs, f"--build-root={root}",
                        env={"TMPDIR": str(work)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert f"would be mounted across the link {root / 'var'}" in line
    assert "set TMPDIR to a directory under /tmp" in line
    assert not any(elsewhere.iterdir())
