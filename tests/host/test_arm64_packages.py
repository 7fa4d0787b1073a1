"""`package build --arch aarch64` from Debian's real arm64 .debs and an aarch64 runfile.

The user-mode files are bookworm's arm64 NVIDIA 535.261.03 packages (tests/arm64debs.py,
cached outside the repo); the modules are small aarch64 ELF objects compiled by the cross
compiler (`gcc-aarch64-linux-gnu`) with the `.modinfo` a real module carries.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import arm64debs
import artifacts
import pytest
from click.testing import CliRunner

from installer.cli import cli
from installer.node import elf
from installer.packages.manifest import parse_manifest
from installer.packages.repository import parse_index

VERSION = "535.261.03"
KERNEL = "6.1.0-26-arm64"
MODULES = {"nvidia": "drm", "nvidia-uvm": "nvidia", "nvidia-modeset": "nvidia",
           "nvidia-drm": "nvidia,nvidia-modeset,drm_kms_helper,drm"}
CROSS_GCC = "aarch64-linux-gnu-gcc"  # Debian's gcc-aarch64-linux-gnu (scripts/install-deps.sh)


@pytest.fixture(scope="module")
def arm64_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("arm64-modules")
    for stem, depends in MODULES.items():
        fields = ["license=NVIDIA", f"version={VERSION}", f"depends={depends}",
                  f"name={stem.replace('-', '_')}",
                  f"vermagic={KERNEL} SMP preempt mod_unload modversions aarch64"]
        source = directory / f"{stem}.c"
        body = "\\0".join(fields)
        source.write_text('static const char modinfo[] __attribute__((section(".modinfo"), '
                          f'used)) = "{body}";\n')
        subprocess.run([CROSS_GCC, "-c", "-o", str(directory / f"{stem}.ko"), str(source)],
                       check=True)
        source.unlink()
    return directory


def build(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["package", "build", *args])
    return result.exit_code, result.stdout, result.stderr


def machine(path: Path) -> str | None:
    return elf.machine(path.read_bytes()[:20])


def check_aarch64_package(package_dir: Path) -> None:
    """The manifest says aarch64 and every library, binary and module is an aarch64 ELF."""
    manifest = parse_manifest((package_dir / "manifest.json").read_bytes())
    assert manifest.arch == "aarch64"
    kinds = {e.kind for e in manifest.files}
    assert {"library", "binary", "module"} <= kinds
    for entry in manifest.files:
        if entry.kind in ("library", "binary", "module"):
            assert machine(package_dir / entry.path) == "aarch64", entry.path
    names = {e.path for e in manifest.files}
    assert {f"lib64/libcuda.so.{VERSION}", f"lib64/libnvidia-ml.so.{VERSION}",
            "bin/nvidia-smi"} <= names
    assert [m.name for m in manifest.modules] == [
        "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


class TestFromDebianArm64Debs:
    def test_arm64_debs_make_an_aarch64_package_at_its_arch_path(
            self, tmp_path: Path, arm64_modules: Path) -> None:
        debs = arm64debs.arm64_debs(VERSION)
        repo = tmp_path / "repo"
        code, out, err = build([*(f"--deb={d}" for d in debs.values()), "--arch=aarch64",
                                f"--modules={arm64_modules}", f"--repo={repo}",
                                "--alias=default", "--output=json"])
        assert code == 0, err
        assert json.loads(out)["manifest"]["arch"] == "aarch64"
        package_dir = repo / KERNEL / VERSION / "proprietary-aarch64"
        check_aarch64_package(package_dir)
        lib = package_dir / f"lib64/libnvidia-ml.so.{VERSION}"
        real = arm64debs.arm64_tree(VERSION) / arm64debs.LIB_DIR / lib.name
        assert lib.read_bytes() == real.read_bytes()
        (entry,) = parse_index((repo / "index.json").read_bytes()).packages
        assert (entry.arch, entry.path) == ("aarch64", f"{KERNEL}/{VERSION}/proprietary-aarch64")

    def test_arm64_debs_without_arch_are_refused_naming_both(
            self, tmp_path: Path, arm64_modules: Path) -> None:
        debs = arm64debs.arm64_debs(VERSION)
        code, _, err = build([*(f"--deb={d}" for d in debs.values()),
                              f"--modules={arm64_modules}", f"--out-dir={tmp_path / 'out'}"])
        assert code == 2
        assert "is for aarch64, not --arch x86_64" in err and "pass --arch aarch64" in err
        assert not (tmp_path / "out").exists()

    def test_amd64_debs_with_arch_aarch64_are_refused(self, tmp_path: Path) -> None:
        debs = artifacts.nvidia_debs(VERSION)
        code, _, err = build([f"--deb={debs['libnvidia-ml1']}", "--arch=aarch64",
                              f"--kernel-release={KERNEL}", f"--out-dir={tmp_path / 'out'}"])
        assert code == 2 and "is for x86_64, not --arch aarch64" in err
        assert not (tmp_path / "out").exists()


class TestFromAarch64Runfile:
    def test_aarch64_runfile_makes_the_same_files_as_the_debs(
            self, tmp_path: Path, arm64_modules: Path) -> None:
        run_file = arm64debs.arm64_runfile(VERSION)
        out_dir = tmp_path / "out"
        code, _, err = build([f"--run={run_file}", "--arch=aarch64",
                              f"--modules={arm64_modules}", f"--out-dir={out_dir}"])
        assert code == 0, err
        check_aarch64_package(out_dir)
        manifest = parse_manifest((out_dir / "manifest.json").read_bytes())
        assert manifest.file("firmware/nvidia/535.261.03/gsp_ga10x.bin").kind == "firmware"
        assert "nvidia-installer" not in {Path(e.path).name for e in manifest.files}

    def test_aarch64_runfile_with_default_arch_is_refused(
            self, tmp_path: Path, arm64_modules: Path) -> None:
        code, _, err = build([f"--run={arm64debs.arm64_runfile(VERSION)}",
                              f"--modules={arm64_modules}", f"--out-dir={tmp_path / 'out'}"])
        assert code == 2 and "NVIDIA-Linux-aarch64-535.261.03.run is for aarch64" in err
