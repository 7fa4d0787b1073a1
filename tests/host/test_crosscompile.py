"""`package build --arch aarch64` with arm64 headers on x86_64: what is refused before make.

The CLI runs in a subprocess (real exit code and stderr); each refusal is one line, exit 2,
nothing published. The headers are fake trees whose .config says CONFIG_ARM64 and Debian's
`gcc-12` (as bookworm's arm64 kernel does); the real cross-compile of NVIDIA's 535 is
tests/kernel/test_cross_arm64_real.py.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nvsources import fake_headers, mini_source

RELEASE = "6.1.0-57-arm64"
CLI = (sys.executable, "-m", "installer")
CROSS = "aarch64-linux-gnu-gcc-12"
pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="cross-compiling for aarch64 is tested from x86_64")


def _refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", *args, "--arch=aarch64",
                           f"--out-dir={out}"], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **(env or {})})
    assert not out.exists(), "something was published"
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error(config): "), lines
    return lines[0]


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    source = mini_source(tmp_path / "nvidia-src")
    headers = fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE, arch="aarch64")
    return f"--nvidia-source={source}", f"--kernel-headers={headers}"


def test_host_without_the_cross_compiler_names_its_package(tmp_path: Path,
                                                           inputs: tuple[str, str]) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    line = _refused(tmp_path, *inputs, env={"PATH": str(empty)})
    assert f"{CROSS} not found: kernel {RELEASE} is aarch64, was built with gcc-12 (Debian" in line
    assert line.endswith("fix: apt-get install gcc-12-aarch64-linux-gnu, or compile in a root "
                         "of the kernel's distro: --build-root auto")


def test_build_root_without_the_cross_compiler(tmp_path: Path,
                                               inputs: tuple[str, str]) -> None:
    root = tmp_path / "root"  # a bookworm root with the native compiler only
    for sub in ("usr/bin", "tmp", "dev", "etc"):
        (root / sub).mkdir(parents=True)
    for tool in ("make", "gcc-12"):
        (root / "usr" / "bin" / tool).write_text("#!/bin/sh\n")
    line = _refused(tmp_path, *inputs, f"--build-root={root}")
    assert f"{CROSS} not found in build root {root}" in line
    assert f"chroot {root} apt-get install gcc-12-aarch64-linux-gnu" in line


def test_auto_root_knows_the_cross_compilers_suite(tmp_path: Path,
                                                   inputs: tuple[str, str]) -> None:
    """gcc-12-aarch64-linux-gnu is bookworm's: auto gets as far as needing mmdebstrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("unshare", "chroot", "mount"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    line = _refused(tmp_path, *inputs, "--build-root=auto",
                    f"--build-root-cache={tmp_path / 'cache'}", env={"PATH": str(bin_dir)})
    assert "--build-root auto needs mmdebstrap" in line


def test_sources_with_another_archs_prebuilt_object(tmp_path: Path) -> None:
    """NVIDIA's nv-kernel.o_binary is per arch: an x86_64 one is refused before make."""
    source = mini_source(tmp_path / "nvidia-src")
    (source / "nvidia").mkdir()
    x86_elf = Path(sys.executable).resolve().read_bytes()[:4096]
    (source / "nvidia" / "nv-kernel.o_binary").write_bytes(x86_elf)
    headers = fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE, arch="aarch64")
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}")
    assert "the NVIDIA sources are for x86_64 (nv-kernel.o_binary is a x86_64 object), not " \
           "aarch64" in line
    assert "fix: give NVIDIA's aarch64 sources" in line
