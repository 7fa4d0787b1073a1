"""`package build --nvidia-source ... --kernel-headers ...`: every bad input refused before make.

The CLI runs in a subprocess (its real exit code, its real stderr). Each refusal is one line
on stderr, exit 2, and nothing is published. Inputs are NVIDIA-shaped sources
(tests/nvsources.py), header trees and .debs packed by Debian's dpkg-deb, the real NVIDIA
535 user-mode tree (tests/artifacts.py), and GNU patch. Nothing here compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import artifacts
import pytest
from nvsources import fake_headers, make_deb, mini_source

RELEASE = "6.1.0-57-amd64"
CLI = (sys.executable, "-m", "installer")  # the real CLI, in a subprocess


def _build(tmp_path: Path, *args: str, env: dict[str, str] | None = None
           ) -> tuple[int, list[str]]:
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", *args, f"--out-dir={out}"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})
    assert not out.exists() or not any(out.iterdir()), "something was published"
    assert done.stdout == ""
    return done.returncode, done.stderr.strip().splitlines()


def _refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    rc, lines = _build(tmp_path, *args, env=env)
    assert rc == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error(config): "), lines
    return lines[0]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return mini_source(tmp_path / "nvidia-src")


@pytest.fixture
def headers(tmp_path: Path) -> Path:
    return fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE)


def test_missing_compiler_names_the_package(tmp_path: Path, source: Path, headers: Path
                                            ) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}",
                    env={"PATH": str(empty)})
    assert "gcc-12 not found" in line and "gcc-12 (Debian 12.2.0-14+deb12u1)" in line
    assert line.endswith("fix: apt-get install gcc-12, or compile in a root of the kernel's "
                         "distro: --build-root auto")


def test_headers_of_another_release_than_their_package_claims(tmp_path: Path, source: Path
                                                              ) -> None:
    claimed = "6.1.0-99-amd64"
    root = tmp_path / "deb"
    fake_headers(root / "usr" / "src" / f"linux-headers-{claimed}", RELEASE)
    deb = make_deb(root, f"linux-headers-{claimed}", "6.1.999-1", tmp_path)
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={deb}")
    assert f"claim release {claimed} but were built for {RELEASE}" in line


def test_headers_directory_named_for_another_release(tmp_path: Path, source: Path) -> None:
    tree = fake_headers(tmp_path / "linux-headers-6.1.0-98-amd64", RELEASE)
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={tree}")
    assert "claim release 6.1.0-98-amd64" in line


def test_corrupt_source_tarball(tmp_path: Path, headers: Path) -> None:
    tarball = tmp_path / "nvidia.tar.xz"
    tarball.write_bytes(b"\xfd7zXZ\x00\x00 this is not the rest of an xz stream")
    line = _refused(tmp_path, f"--nvidia-source={tarball}", f"--kernel-headers={headers}")
    assert "cannot unpack the NVIDIA sources" in line


def test_truncated_source_deb(tmp_path: Path, source: Path, headers: Path) -> None:
    root = tmp_path / "debroot"
    (root / "usr" / "src").mkdir(parents=True)
    subprocess.run(["tar", "-cJf", str(root / "usr" / "src" / "nvidia-kernel.tar.xz"),
                    "-C", str(source.parent), source.name], check=True)
    deb = make_deb(root, "nvidia-kernel-source", "535.261.03-1", tmp_path)
    data = deb.read_bytes()
    deb.write_bytes(data[: len(data) * 2 // 3])
    line = _refused(tmp_path, f"--nvidia-source={deb}", f"--kernel-headers={headers}")
    assert str(deb) in line and ("cannot" in line or "damaged" in line)


def test_arch_mismatch(tmp_path: Path, source: Path) -> None:
    tree = fake_headers(tmp_path / "linux-headers-6.1.0-57-arm64", "6.1.0-57-arm64",
                        arch="aarch64")
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={tree}",
                    "--arch=x86_64")
    assert "are for aarch64, not --arch x86_64" in line


def test_the_headers_name_the_arch_when_arch_is_not_given(tmp_path: Path,
                                                          source: Path) -> None:
    """No --arch: the arm64 headers' .config says aarch64, so they are not refused as
    another arch's; the compile for them starts (and fails: the tree compiles nothing)."""
    tree = fake_headers(tmp_path / "linux-headers-6.1.0-57-arm64", "6.1.0-57-arm64",
                        arch="aarch64")
    rc, lines = _build(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={tree}")
    assert rc == 2 and not any("not --arch" in line for line in lines), lines
    started = [json.loads(line) for line in lines if line.startswith("{")]
    assert [e["release"] for e in started if e["event"] == "compiling modules"] == [
        "6.1.0-57-arm64"], lines


@pytest.mark.parametrize(("deb_arch", "expected"), [("arm64", "aarch64"),
                                                    ("amd64", "x86_64"), ("all", None)])
def test_a_headers_deb_names_its_arch(tmp_path: Path, deb_arch: str,
                                      expected: str | None) -> None:
    from installer.packages.builder.headersarch import headers_arch

    (tmp_path / "root").mkdir()
    deb = make_deb(tmp_path / "root", "linux-headers-6.1.0-57", "6.1.0-57", tmp_path,
                   arch=deb_arch)
    assert headers_arch((deb,)) == expected


def test_patch_that_does_not_apply(tmp_path: Path, source: Path, headers: Path) -> None:
    patch = tmp_path / "fix-pci.patch"
    patch.write_text("--- a/nvidia.c\n+++ b/nvidia.c\n@@ -1,3 +1,3 @@\n no such line\n"
                     "-in this file\n+at all\n no\n")
    before = (source / "nvidia.c").read_bytes()
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}",
                    f"--patch={patch}")
    assert "patch fix-pci.patch does not apply" in line
    assert (source / "nvidia.c").read_bytes() == before  # the user's tree is never patched


def test_source_version_differs_from_user_mode_files(tmp_path: Path, headers: Path) -> None:
    source = mini_source(tmp_path / "src550", "550.54.14")
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}",
                    f"--tree={artifacts.nvidia_tree('535.261.03')}")
    assert "sources are version 550.54.14 but the user-mode files are 535.261.03" in line


def test_open_flavour_needs_open_sources(tmp_path: Path, headers: Path) -> None:
    source = mini_source(tmp_path / "kernel")  # a .run's kernel/: proprietary only
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}",
                    "--flavour=open")
    assert "has no open modules" in line


def test_sources_alone_make_no_package(tmp_path: Path, source: Path) -> None:
    """Without headers the sources make a source package, which needs user-mode files."""
    line = _refused(tmp_path, f"--nvidia-source={source}")
    assert "a source package needs the user-mode files too" in line


def test_run_layout_needs_a_flavour_when_it_has_both(tmp_path: Path, headers: Path) -> None:
    """An extracted .run: kernel/ is proprietary, kernel-open/ open; both there -> say which."""
    extracted = tmp_path / "NVIDIA-Linux-x86_64-535.261.03"
    mini_source(extracted / "kernel")
    mini_source(extracted / "kernel-open")
    line = _refused(tmp_path, f"--nvidia-source={extracted}", f"--kernel-headers={headers}")
    assert "has both open and proprietary modules" in line
    assert line.endswith("fix: pass --flavour open or --flavour proprietary")
    empty = tmp_path / "bin"
    empty.mkdir()
    line = _refused(tmp_path, f"--nvidia-source={extracted}", f"--kernel-headers={headers}",
                    "--flavour=open", env={"PATH": str(empty)})
    assert "gcc-12 not found" in line  # open chosen, every check passed up to the compiler


def test_licence_in_nv_c_is_proprietary(tmp_path: Path, headers: Path) -> None:
    """550 moved MODULE_LICENSE("NVIDIA") from nv-frontend.c to nv.c: still proprietary."""
    source = mini_source(tmp_path / "nvidia-kernel")
    (source / "nvidia").mkdir()
    (source / "nvidia" / "nv.c").write_text('MODULE_LICENSE("NVIDIA");\n')
    line = _refused(tmp_path, f"--nvidia-source={source}", f"--kernel-headers={headers}",
                    "--flavour=open")
    assert "has no open modules (it has proprietary)" in line
