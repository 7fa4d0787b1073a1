"""`package build --fabricmanager/--nvlsm/--persistenced`, then staging and finding them.

Debian's real `nvidia-persistenced` .deb (bookworm, 535.171.04: Debian packages it apart from
the driver, at its own version; tests/artifacts.py) and Fabric Manager / NVLSM inputs in
NVIDIA's archive and .deb layouts (tests/daemoninputs.py; NVIDIA's own are not in Debian's
archive). The real CLI runs in a subprocess; the package is read back verified
(`read_tree`), staged into a sample node, and `staged_daemons` finds the daemons there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import artifacts
import pytest
from daemoninputs import (
    FM_CONFIG,
    NVLSM_CONFIGS,
    TOPOLOGIES,
    elf,
    fm_archive,
    fm_deb,
    imex_deb,
    nvlsm_archive,
)
from native.contexts import make_ctx
from nvsources import make_deb

from installer.errors import IncompatibleError
from installer.installdir import layout
from installer.installdir.daemons import require_daemons, staged_daemons
from installer.packages.tree import read_tree
from installer.stages import stage
from tests.host.test_packagebuild import KERNEL, VERSION, make_modules
from tests.unit.test_schemas import MANIFEST

NVLSM_VERSION = "2025.06.6"
INSTALL = "home/kubernetes/bin/nvidia"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A small real user-mode side (libnvidia-ml, nvidia-smi) and modules for one kernel."""
    debs = artifacts.nvidia_debs(VERSION)
    modules = make_modules(tmp_path_factory.mktemp("modules"))
    return [f"--deb={debs['libnvidia-ml1']}", f"--deb={debs['nvidia-smi']}",
            f"--modules={modules}"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("daemon-inputs")
    return {"fm": fm_archive(where, VERSION), "nvlsm": nvlsm_archive(where, NVLSM_VERSION),
            "persistenced": artifacts.persistenced_deb()}


def build(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process."""
    return subprocess.run([sys.executable, "-m", "installer", "package", "build", *args],
                          capture_output=True, text=True, check=False, timeout=300)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def real_persistenced(tmp_path: Path) -> Path:
    """The executable of Debian's package, extracted with the real dpkg-deb."""
    subprocess.run(["dpkg-deb", "-x", str(artifacts.persistenced_deb()), str(tmp_path / "x")],
                   check=True)
    return tmp_path / "x" / "usr" / "bin" / "nvidia-persistenced"


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory: pytest.TempPathFactory, base: list[str],
                inputs: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("built") / "pkg"
    done = build(*base, f"--fabricmanager={inputs['fm']}", f"--nvlsm={inputs['nvlsm']}",
                 f"--persistenced={inputs['persistenced']}", f"--out-dir={out}",
                 "--output=json")
    assert done.returncode == 0, done.stderr
    return out


class TestBuild:
    """Each input kind gives the daemon's files and its version, hashed like every file."""

    def test_archives_and_debian_deb_are_recorded_with_versions(
            self, package_dir: Path, tmp_path: Path) -> None:
        manifest = read_tree(package_dir).manifest  # every file re-hashed against its entry
        versions = {d.name: d.version for d in manifest.daemons}
        assert versions == {"nv-fabricmanager": VERSION, "nvlsm": NVLSM_VERSION,
                            "nvidia-persistenced": artifacts.PERSISTENCED_VERSION}
        fm, sm = manifest.daemon("nv-fabricmanager"), manifest.daemon("nvlsm")
        assert fm is not None and sm is not None
        assert set(fm.files) == {"bin/nv-fabricmanager", "etc/fabricmanager.cfg",
                                 *(f"etc/{name}" for name in TOPOLOGIES)}
        assert set(sm.files) == {"bin/nvlsm", "lib64/libgrpc_mgr.so",
                                 *(f"etc/{name}" for name in NVLSM_CONFIGS)}
        # what NVIDIA's archive also holds but no daemon runs on is left out
        paths = {f.path for f in manifest.files}
        assert not {"bin/nvswitch-audit", "lib64/libnvfm.so.1", "etc/nvidia-persistenced"} & paths
        kinds = {f.path: (f.kind, f.mode) for f in manifest.files}
        assert kinds["bin/nv-fabricmanager"] == ("binary", 0o755)
        assert kinds["etc/fabricmanager.cfg"] == ("config", 0o644)
        assert kinds["lib64/libgrpc_mgr.so"] == ("library", 0o644)
        assert (package_dir / "etc/fabricmanager.cfg").read_text() == FM_CONFIG

    def test_the_real_debian_executable_is_taken_byte_for_byte(
            self, package_dir: Path, tmp_path: Path) -> None:
        real = real_persistenced(tmp_path)
        doc = json.loads((package_dir / "manifest.json").read_text())
        MANIFEST.validate(doc)
        assert doc["daemons"]["nvidia-persistenced"] == {
            "version": "535.171.04", "files": [{"path": "bin/nvidia-persistenced",
                                                "sha256": sha256(real)}]}
        assert sha256(package_dir / "bin/nvidia-persistenced") == sha256(real)

    def test_nvidia_deb_and_plain_executable(self, tmp_path: Path, base: list[str]) -> None:
        """Fabric Manager from NVIDIA's .deb layout (control Version 535.261.03-1) and the
        persistence daemon as a plain executable (its version string read, never run)."""
        out = tmp_path / "pkg"
        done = build(*base, f"--fabricmanager={fm_deb(tmp_path, VERSION)}",
                     f"--persistenced={real_persistenced(tmp_path)}", f"--out-dir={out}")
        assert done.returncode == 0, done.stderr
        manifest = read_tree(out).manifest
        fm = manifest.daemon("nv-fabricmanager")
        assert fm is not None and fm.version == VERSION and fm.config == "etc/fabricmanager.cfg"
        persistenced = manifest.daemon("nvidia-persistenced")
        assert persistenced is not None and persistenced.version == "535.171.04"

    def test_imex_takes_the_service_its_query_tool_and_config_not_the_sites_nodes(
            self, tmp_path: Path, base: list[str]) -> None:
        out = tmp_path / "pkg"
        done = build(*base, f"--imex={imex_deb(tmp_path, VERSION)}", f"--out-dir={out}",
                     "--output=json")
        assert done.returncode == 0, done.stderr
        doc = json.loads((out / "manifest.json").read_text())
        MANIFEST.validate(doc)
        imex = read_tree(out).manifest.daemon("nvidia-imex")
        assert imex is not None and imex.version == VERSION
        assert set(imex.files) == {"bin/nvidia-imex", "bin/nvidia-imex-ctl",
                                   "etc/nvidia-imex.cfg"}
        assert imex.binary == "bin/nvidia-imex" and imex.config == "etc/nvidia-imex.cfg"
        assert not any("nodes_config" in f["path"] for f in doc["files"])

    def test_a_renamed_archive_keeps_the_version_of_its_top_directory(
            self, tmp_path: Path, base: list[str]) -> None:
        archive = fm_archive(tmp_path, VERSION, file_name="fm.tar.xz")
        done = build(*base, f"--fabricmanager={archive}", f"--out-dir={tmp_path / 'pkg'}")
        assert done.returncode == 0, done.stderr
        fm = read_tree(tmp_path / "pkg").manifest.daemon("nv-fabricmanager")
        assert fm is not None and fm.version == VERSION

    def test_a_debian_version_loses_its_epoch_and_revision(
            self, tmp_path: Path, base: list[str]) -> None:
        root = tmp_path / "deb"
        elf(root / "usr" / "bin" / "nvidia-persistenced")  # names no version itself
        deb = make_deb(root, "nvidia-persistenced", "1:535.54.03-2~bpo12+1", tmp_path)
        done = build(*base, f"--persistenced={deb}", f"--out-dir={tmp_path / 'pkg'}")
        assert done.returncode == 0, done.stderr
        daemon = read_tree(tmp_path / "pkg").manifest.daemon("nvidia-persistenced")
        assert daemon is not None and daemon.version == "535.54.03"

    def test_the_daemon_replaces_a_tool_of_the_same_name(
            self, tmp_path: Path, base: list[str]) -> None:
        """A user-mode input's own nvidia-persistenced (as a .run has) gives way to the
        daemon input: one bin/nvidia-persistenced, the daemon's."""
        tree = tmp_path / "tree"
        tool = elf(tree / "usr" / "bin" / "nvidia-persistenced", banner="version 535.261.03")
        real = real_persistenced(tmp_path)
        assert sha256(tool) != sha256(real)
        done = build(*base, f"--tree={tree}", f"--persistenced={real}",
                     f"--out-dir={tmp_path / 'pkg'}")
        assert done.returncode == 0, done.stderr
        manifest = read_tree(tmp_path / "pkg").manifest
        assert manifest.file("bin/nvidia-persistenced").sha256 == sha256(real)
        daemon = manifest.daemon("nvidia-persistenced")
        assert daemon is not None and daemon.version == "535.171.04"


def refusal(tmp_path: Path, base: list[str], *args: str) -> str:
    """Exit 2, one line, nothing written."""
    out = tmp_path / "pkg"
    done = build(*base, *args, f"--out-dir={out}")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(lines) == 1, done.stderr
    assert not out.exists()
    return lines[0]


class TestRefusals:
    """Inputs that cannot be the daemon asked for: exit 2 with the fix."""

    def test_fabric_manager_of_another_version(self, tmp_path: Path, base: list[str]) -> None:
        line = refusal(tmp_path, base, f"--fabricmanager={fm_archive(tmp_path, '535.247.01')}")
        assert "is Fabric Manager 535.247.01, but the driver is 535.261.03" in line
        assert "fabricmanager-linux-<arch>-535.261.03-archive.tar.xz" in line

    def test_imex_of_another_version(self, tmp_path: Path, base: list[str]) -> None:
        line = refusal(tmp_path, base, f"--imex={imex_deb(tmp_path, '570.124.06')}")
        assert "is nvidia-imex 570.124.06, but the driver is 535.261.03" in line
        assert "nvidia-imex .deb of version 535.261.03" in line

    def test_another_components_archive(self, tmp_path: Path, base: list[str]) -> None:
        line = refusal(tmp_path, base,
                       f"--fabricmanager={nvlsm_archive(tmp_path, NVLSM_VERSION)}")
        assert "is NVIDIA's nvlsm archive, not fabricmanager's" in line

    def test_another_platforms_archive(self, tmp_path: Path, base: list[str]) -> None:
        archive = fm_archive(tmp_path, VERSION, platform="sbsa")
        assert "is for sbsa, not x86_64" in refusal(tmp_path, base, f"--fabricmanager={archive}")

    def test_an_executable_without_a_version(self, tmp_path: Path, base: list[str]) -> None:
        binary = elf(tmp_path / "nv-fabricmanager")
        line = refusal(tmp_path, base, f"--fabricmanager={binary}")
        assert "cannot tell the version of --fabricmanager" in line and "it names none" in line

    def test_something_else(self, tmp_path: Path, base: list[str]) -> None:
        text = tmp_path / "notes.txt"
        text.write_text("not a daemon\n")
        line = refusal(tmp_path, base, f"--nvlsm={text}")
        assert "is neither NVIDIA's archive, a .deb nor an executable" in line

    def test_a_source_package_carries_no_daemons(self, tmp_path: Path, base: list[str],
                                                 inputs: dict[str, Path]) -> None:
        """Refused before anything is unpacked (nodes would build it without them)."""
        line = refusal(tmp_path, base[:2], f"--nvidia-source={inputs['fm']}",
                       f"--persistenced={inputs['persistenced']}")
        assert "a source package carries no daemons" in line


class TestStaged:
    """The stage puts the daemons in the version dir; `staged_daemons` finds them there."""

    def test_staged_daemons_are_found_under_current(
            self, make_node: Callable[[str], Path], package_dir: Path) -> None:
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        package = read_tree(package_dir)
        result = stage.stage_package(ctx, package)
        staged = staged_daemons(ctx.config, ctx.host.roots)
        current = root / INSTALL / layout.CURRENT
        assert set(staged) == {"nv-fabricmanager", "nvlsm", "nvidia-persistenced"}
        fm = staged["nv-fabricmanager"]
        assert (fm.version, fm.binary, fm.config) == (
            VERSION, current / "bin/nv-fabricmanager", current / "etc/fabricmanager.cfg")
        assert os.access(fm.binary, os.X_OK) and fm.config is not None
        assert fm.config.read_text() == FM_CONFIG
        assert {p.name for p in fm.files} >= set(TOPOLOGIES)
        assert all(p.is_file() for d in staged.values() for p in d.files)
        assert staged["nvlsm"].config == current / "etc/nvlsm.conf"
        assert staged["nvidia-persistenced"].config is None
        assert os.readlink(current) == f"{layout.VERSIONS}/{result.version}"
        require_daemons("nvlink5", staged, package.manifest.driver_version)
        with pytest.raises(IncompatibleError, match=r"differs from the driver 535\.309\.01"):
            require_daemons("nvswitch", staged, "535.309.01")

    def test_a_package_without_daemons_stages_none(
            self, make_node: Callable[[str], Path], tmp_path: Path, base: list[str]) -> None:
        out = tmp_path / "plain"
        done = build(*base, f"--out-dir={out}")
        assert done.returncode == 0, done.stderr
        root = make_node("debian12-l4")
        ctx = make_ctx(root)
        stage.stage_package(ctx, read_tree(out))
        meta = json.loads((root / INSTALL / layout.CURRENT / layout.STAGED_META).read_text())
        assert "daemons" not in meta
        assert staged_daemons(ctx.config, ctx.host.roots) == {}
        with pytest.raises(IncompatibleError) as info:
            require_daemons("nvswitch", {}, read_tree(out).manifest.driver_version)
        assert info.value.code == 14 and "--fabricmanager" in info.value.remedy


def test_kernel_is_the_modules(package_dir: Path) -> None:
    """The daemons change nothing of the package's identity."""
    manifest = read_tree(package_dir).manifest
    assert (manifest.driver_version, manifest.kernel_release) == (VERSION, KERNEL)
