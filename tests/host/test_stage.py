"""The stage stage over real NVIDIA 535 user-mode files in a temp host tree.

Packages point into the cached Debian extraction (tests/artifacts.py); the install dir is
the GKE default under a sample node's host root.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import artifacts
import pytest
from click.testing import CliRunner
from native.contexts import make_ctx
from native.packages import tree_package

from installer.cli import cli
from installer.errors import StagingError
from installer.installdir import layout, versions
from installer.packages.manifest import Package
from installer.stages import stage

A, B = "535.261.03", "535.309.01"
INSTALL = "home/kubernetes/bin/nvidia"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def packages() -> dict[str, Package]:
    """Two real driver versions (the second is Debian's security update)."""
    return {v: tree_package(artifacts.nvidia_tree(v), v) for v in (A, B)}


def readelf_soname(path: Path) -> str | None:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


def version_of(install: Path, sub: str = "lib64") -> str | None:
    """Which driver version a top-level link shows, judged by its real files."""
    names = [p.name for p in (install / sub).iterdir() if not p.is_symlink()]
    found = {n.rsplit(".so.", 1)[1] for n in names if ".so." in n}
    return found.pop() if len(found) == 1 else None


class TestStageRealFiles:
    """Layout, SONAME links and relative links with NVIDIA's real libraries."""

    def test_soname_links_match_readelf(self, make_node: Callable[[str], Path],
                                        packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        result = stage.stage_package(make_ctx(root), packages[A])
        lib64 = root / INSTALL / "lib64"
        real = [p for p in lib64.iterdir() if not p.is_symlink()]
        assert len(real) == 4
        for library in real:
            soname = readelf_soname(library)
            assert soname and soname != library.name
            assert (lib64 / soname).is_symlink()
            assert os.readlink(lib64 / soname) == library.name
            assert result.soname_links[soname] == library.name
        assert os.readlink(lib64 / "libcuda.so") == "libcuda.so.1"
        assert os.readlink(lib64 / "libnvidia-ml.so") == "libnvidia-ml.so.1"
        assert os.access(root / INSTALL / "bin" / "nvidia-smi", os.X_OK)
        assert result.version == f"{A}-6.1.0-26-cloud-amd64-proprietary"

    def test_every_link_is_relative_and_resolves_from_a_container_mount(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        stage.stage_package(make_ctx(root), packages[A])
        for dirpath, dirnames, filenames in os.walk(root / INSTALL):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink():
                    assert not os.readlink(path).startswith("/"), path
        # the device plugin mounts the install dir elsewhere: /usr/local/nvidia
        mount = root / "container" / "usr" / "local" / "nvidia"
        mount.parent.mkdir(parents=True)
        os.rename(root / INSTALL, mount)
        nvml = mount / "lib64" / "libnvidia-ml.so.1"
        assert nvml.resolve().is_relative_to(mount.resolve())
        assert nvml.resolve().name == f"libnvidia-ml.so.{A}"
        assert (mount / "bin" / "nvidia-smi").resolve().is_file()

    def test_driver_root_layout_for_gpu_operator_consumers(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        stage.stage_package(make_ctx(root, driver_root_layout=True), packages[A])
        install = root / INSTALL
        nvml = install / "usr" / "lib" / "x86_64-linux-gnu" / "libnvidia-ml.so.1"
        assert nvml.resolve().name == f"libnvidia-ml.so.{A}"
        assert (install / "usr" / "bin" / "nvidia-smi").resolve().is_file()
        assert (install / "usr" / "lib64" / "libcuda.so.1").exists()

    def test_hard_links_share_the_cache_file_when_possible(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        package = packages[A]
        stage.stage_package(make_ctx(root), package)
        source = package.path_of(package.manifest.files[0].path)
        staged = root / INSTALL / "lib64" / source.name
        same_fs = os.stat(source.parent).st_dev == os.stat(root).st_dev
        read_only = not package.manifest.files[0].mode & 0o222  # a writable file is copied
        assert os.path.samefile(source, staged) == (same_fs and read_only)
        assert staged.stat().st_size == source.stat().st_size


class TestSwitching:
    """A second version, reuse, rollback, pruning, ld.so.conf.d and ldconfig."""

    def test_second_version_switches_and_remembers_the_first(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        stage.stage_package(ctx, packages[A])
        result = stage.stage_package(ctx, packages[B])
        install = root / INSTALL
        assert version_of(install) == B
        assert result.previous == f"{A}-6.1.0-26-cloud-amd64-proprietary"
        assert (install / "lib64" / "libcuda.so.1").resolve().name == f"libcuda.so.{B}"
        assert os.readlink(install / "lib64") == ".current/lib64"

    def test_restaging_the_same_package_reuses_it(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        first = stage.stage_package(ctx, packages[A])
        inode = (root / INSTALL / "lib64" / f"libcuda.so.{A}").stat().st_ino
        second = stage.stage_package(ctx, packages[A])
        assert (first.reused, second.reused) == (False, True)
        assert (root / INSTALL / "lib64" / f"libcuda.so.{A}").stat().st_ino == inode

    def test_rollback_command_switches_back(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        stage.stage_package(ctx, packages[A])
        stage.stage_package(ctx, packages[B])
        args = ["stage", "--rollback", "--host-root", str(root), "--proc-root",
                str(root / "proc"), "--sys-root", str(root / "sys"), "--log-format", "json"]
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 0, done.output
        assert "Rolled back" in done.stdout
        assert version_of(root / INSTALL) == A
        assert versions.previous_name(root / INSTALL) == f"{B}-6.1.0-26-cloud-amd64-proprietary"

    def test_rollback_without_previous_fails_with_staging_code(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        stage.stage_package(make_ctx(root), packages[A])
        with pytest.raises(StagingError) as raised:
            stage.rollback(root / INSTALL)
        assert raised.value.code == 11

    def test_older_versions_are_pruned(self, make_node: Callable[[str], Path],
                                       packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        other = tree_package(artifacts.nvidia_tree(A), A, kernel="6.1.0-27-cloud-amd64")
        for package in (packages[A], packages[B], other):
            stage.stage_package(ctx, package)
        versions = sorted(p.name for p in (root / INSTALL / ".versions").iterdir())
        assert versions == [f"{A}-6.1.0-27-cloud-amd64-proprietary",
                            f"{B}-6.1.0-26-cloud-amd64-proprietary"]

    def test_ld_so_conf_written_once_and_ldconfig_run_on_the_host(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        (root / "sbin").mkdir()
        (root / "sbin" / "ldconfig").write_text("#!/bin/sh\n")
        ctx = make_ctx(root)
        stage.stage_package(ctx, packages[A])
        conf = root / "etc" / "ld.so.conf.d" / "gpu-node-installer.conf"
        assert conf.read_text().splitlines()[-1] == "/home/kubernetes/bin/nvidia/lib64"
        before = conf.stat().st_mtime_ns
        stage.stage_package(ctx, packages[B])
        assert conf.stat().st_mtime_ns == before
        assert not (root / "etc" / "ld.so.conf").exists()
        assert ctx.host.commands == [("chroot", str(root), "/sbin/ldconfig")] * 2  # type: ignore[attr-defined]
        stage.stage_package(ctx, packages[B])  # nothing changed: no ldconfig (fast path)
        assert len(ctx.host.commands) == 2  # type: ignore[attr-defined]

    def test_legacy_real_lib64_directory_steps_aside(
            self, make_node: Callable[[str], Path], packages: dict[str, Package]) -> None:
        root = make_node("debian12-l4")
        legacy = root / INSTALL / "lib64"
        legacy.mkdir(parents=True)
        (legacy / "libold.so").write_text("old")
        stage.stage_package(make_ctx(root), packages[A])
        assert (root / INSTALL / "lib64").is_symlink()
        assert version_of(root / INSTALL) == A

    def test_stage_without_a_package_fails_with_code_11(
            self, make_node: Callable[[str], Path]) -> None:
        with pytest.raises(StagingError) as raised:
            stage.run(make_ctx(make_node("debian12-l4")))
        assert raised.value.code == 11


_CHILD = """
import pickle, sys
from installer.cli import logs
from installer.stages import stage
from installer.config import load_config
from installer.node.host import RealHost, Roots
from installer.context import Context
root, pkg_file, hard = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
config = load_config({"host_root": root, "proc_root": root + "/proc",
                      "sys_root": root + "/sys", "log_format": "json"}, {})
ctx = Context(config=config, host=RealHost(Roots.from_config(config)), log=logs.get_logger())
with open(pkg_file, "rb") as handle:
    package = pickle.load(handle)
print("go", flush=True)
stage.stage_package(ctx, package, allow_hardlinks=hard)
print("done", flush=True)
"""


def _stage_child(root: Path, pkg_file: Path, *, hard: bool) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), str(pkg_file),
                              "1" if hard else "0"], stdout=subprocess.PIPE, text=True,
                             env=env, cwd=REPO)
    assert child.stdout is not None and child.stdout.readline() == "go\n"
    return child


def _assert_complete(install: Path, expected: dict[str, dict[str, int]]) -> str:
    """lib64 and bin show one complete version: every file, full size, links resolving."""
    version = version_of(install)
    assert version in expected, sorted(p.name for p in (install / "lib64").iterdir())
    for sub in ("lib64", "bin"):
        found = {p.name: p.stat().st_size for p in (install / sub).iterdir()
                 if not p.is_symlink()}
        assert found == expected[version][sub], (version, sub)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so"):
        assert (install / "lib64" / name).resolve().name == f"{name.split('.so')[0]}.so.{version}"
    return version


def _timed_run(root: Path, pkg_file: Path, *, hard: bool) -> float:
    child = _stage_child(root, pkg_file, hard=hard)
    start = time.monotonic()
    assert child.wait(timeout=60) == 0
    return time.monotonic() - start


def test_sigkill_at_random_points_leaves_old_or_new_complete(
        make_node: Callable[[str], Path], tmp_path: Path) -> None:
    """Acceptance: kill `stage` at >= 50 random instants; lib64/bin are never a mix.

    Before each run the target version's directory is removed, so every run builds (copy
    or hard links) and switches; the kill instant is drawn over that run's whole length.
    """
    root = make_node("debian12-l4")
    install = root / INSTALL
    pkg_files, expected = {}, {}
    for version in (A, B):
        package = tree_package(artifacts.nvidia_tree(version), version,
                               only=("libcuda", "libnvidia-ml"))
        pkg_files[version] = tmp_path / f"{version}.pickle"
        pkg_files[version].write_bytes(pickle.dumps(package))
        by_sub: dict[str, dict[str, int]] = {"lib64": {}, "bin": {}}
        for entry in package.manifest.files:
            by_sub[layout.destination(entry).parts[0]][Path(entry.path).name] = entry.size
        expected[version] = by_sub
    names = {v: f"{v}-6.1.0-26-cloud-amd64-proprietary" for v in (A, B)}
    durations = {hard: _timed_run(root, pkg_files[A], hard=hard) for hard in (False, True)}
    rng = random.Random(1234)
    seen, kills = set(), 0
    while kills < 56:
        current = _assert_complete(install, expected)
        target = B if current == A else A
        shutil.rmtree(install / ".versions" / names[target], ignore_errors=True)
        hard = kills % 3 == 2
        child = _stage_child(root, pkg_files[target], hard=hard)
        try:
            child.wait(timeout=rng.uniform(0, durations[hard] * 1.1))
        except subprocess.TimeoutExpired:
            child.kill()
            kills += 1
        child.wait()
        seen.add(_assert_complete(install, expected))
    assert seen == {A, B}
    _timed_run(root, pkg_files[B], hard=False)
    assert _assert_complete(install, expected) == B
    leftovers = [p.name for p in (install / ".versions").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_stage_command_fetches_a_built_package_and_stages_it(
        make_node: Callable[[str], Path], tmp_path: Path) -> None:
    """`package build` -> preloaded repository -> `stage` (detect, fetch, stage) end to end."""
    root = make_node("debian12-l4")
    repo = tmp_path / "repo"
    built = CliRunner().invoke(cli, [
        "package", "build", "--tree", str(artifacts.nvidia_tree(A)), "--kernel-release",
        "6.1.0-26-cloud-amd64", "--flavour", "proprietary", "--repo", str(repo),
        "--alias", "default"])
    assert built.exit_code == 0, built.output
    done = CliRunner().invoke(cli, [
        "stage", "--output", "json", "--host-root", str(root), "--proc-root",
        str(root / "proc"), "--sys-root", str(root / "sys"), "--preloaded-dir", str(repo),
        "--log-format", "json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["version"] == f"{A}-6.1.0-26-cloud-amd64-proprietary"
    assert result["soname_links"]["libnvidia-ml.so.1"] == f"libnvidia-ml.so.{A}"
    assert version_of(root / INSTALL) == A
    assert (root / INSTALL / "bin" / "nvidia-smi").resolve().is_file()
