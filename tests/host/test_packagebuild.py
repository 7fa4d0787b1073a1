"""`package build` from the real NVIDIA 535 Debian packages, a real makeself .run, and modules.

The user-mode side is NVIDIA's real files (tests/artifacts.py, cached outside the repo). The
kernel modules are small ELF objects compiled with gcc whose `.modinfo` sections say what
real NVIDIA modules say (name, version, licence, depends, vermagic): what the builder reads.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import artifacts
import pytest
from click.testing import CliRunner
from helpers import node_args, tree_listing
from httpserver import MirrorServer
from nvsources import repack_deb

from installer.cli import cli
from installer.packages.manifest import parse_manifest
from installer.packages.repository import parse_index

VERSION = "535.261.03"
KERNEL = "6.1.0-26-cloud-amd64"  # the debian12-l4 sample node's kernel
LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so")
MODULES = {  # file stem: (depends, licence)
    "nvidia": ("drm", "NVIDIA"),
    "nvidia-uvm": ("nvidia", "NVIDIA"),
    "nvidia-modeset": ("nvidia", "NVIDIA"),
    "nvidia-drm": ("nvidia,nvidia-modeset,drm_kms_helper,drm", "NVIDIA"),
    "nvidia-peermem": ("nvidia,ib_core", "NVIDIA"),
}


def compile_module(directory: Path, stem: str, depends: str, licence: str, *,
                   version: str = VERSION, kernel: str = KERNEL) -> Path:
    """An ELF relocatable object with a real `.modinfo` section (what modpost writes)."""
    fields = [f"license={licence}", f"version={version}", f"depends={depends}",
              f"name={stem.replace('-', '_')}", f"vermagic={kernel} SMP preempt mod_unload "]
    body = "\\0".join(fields)
    source = directory / f"{stem}.c"
    source.write_text('static const char modinfo[] __attribute__((section(".modinfo"), '
                      f'used)) = "{body}";\n')
    target = directory / f"{stem}.ko"
    subprocess.run(["gcc", "-c", "-o", str(target), str(source)], check=True)
    source.unlink()
    return target


def make_modules(directory: Path, *, version: str = VERSION, licence: str = "NVIDIA",
                 modules: dict[str, tuple[str, str]] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for stem, (depends, default_licence) in (modules or MODULES).items():
        compile_module(directory, stem, depends, licence or default_licence, version=version)
    return directory


@pytest.fixture(scope="module")
def modules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_modules(tmp_path_factory.mktemp("modules"))


@pytest.fixture(scope="module")
def run_file() -> Path:
    """NVIDIA-style .run (flat: libraries, nvidia-smi, firmware/) made by Debian's makeself."""
    target = artifacts.cache_root() / "run" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    if target.is_file():
        return target
    tree = artifacts.nvidia_tree(VERSION)
    staging = target.with_name(target.name + ".src")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in (tree / artifacts.LIB_DIR).iterdir():
        shutil.copy2(path, staging / path.name, follow_symlinks=False)
    shutil.copy2(tree / "usr/lib/nvidia/current/nvidia-smi", staging / "nvidia-smi")
    (staging / "firmware").mkdir()
    (staging / "firmware" / "gsp_ga10x.bin").write_bytes(hashlib.sha256(b"gsp").digest() * 64)
    return artifacts.makeself_run(staging, target, "x86_64", VERSION,
                                  "#!/bin/sh\necho never run by package build\n")


def build(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["package", "build", *args])
    return result.exit_code, result.stdout, result.stderr


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TestFromDebianPackages:
    """The .deb files themselves (read without dpkg) plus a modules directory."""

    def test_repo_package_holds_the_real_files_and_modules_in_load_order(
            self, tmp_path: Path, modules_dir: Path) -> None:
        debs = artifacts.nvidia_debs(VERSION)
        repo = tmp_path / "repo"
        code, out, err = build([*(f"--deb={d}" for d in debs.values()),
                                f"--modules={modules_dir}", f"--repo={repo}",
                                "--alias=default", "--alias=535", "--output=json"])
        assert code == 0, err
        package_dir = repo / KERNEL / VERSION / "proprietary"
        data = (package_dir / "manifest.json").read_bytes()
        manifest = parse_manifest(data)
        assert json.loads(out)["digest"] == hashlib.sha256(data).hexdigest()
        tree = artifacts.nvidia_tree(VERSION)
        for lib in LIBS:
            entry = manifest.file(f"lib64/{lib}.{VERSION}")
            real = tree / artifacts.LIB_DIR / f"{lib}.{VERSION}"
            assert (entry.kind, entry.size, entry.sha256, entry.mode) == (
                "library", real.stat().st_size, sha256(real), 0o644)
            assert sha256(package_dir / entry.path) == entry.sha256
        smi = manifest.file("bin/nvidia-smi")
        assert smi.kind == "binary" and smi.mode == 0o755
        assert (package_dir / "bin/nvidia-smi").stat().st_mode & 0o777 == 0o755
        assert [m.name for m in manifest.modules] == [
            "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
        drm = manifest.modules[3]
        assert drm.depends == ("nvidia", "nvidia_modeset", "drm_kms_helper", "drm")
        assert manifest.file("modules/nvidia-peermem.ko").kind == "module"
        assert {link.path: link.target for link in manifest.links}["lib64/libcuda.so.1"] == (
            f"libcuda.so.{VERSION}")
        index = parse_index((repo / "index.json").read_bytes())
        assert index.aliases == {"default": VERSION, "535": VERSION}
        (entry,) = index.packages
        assert entry.manifest_sha256 == hashlib.sha256(data).hexdigest()
        assert entry.path == f"{KERNEL}/{VERSION}/proprietary"

    def test_debs_and_their_extracted_tree_give_the_same_digest(
            self, tmp_path: Path, modules_dir: Path) -> None:
        debs = artifacts.nvidia_debs(VERSION)
        tree = artifacts.nvidia_tree(VERSION)
        digests = []
        for name, inputs in (("debs", [f"--deb={d}" for d in debs.values()]),
                             ("tree", [f"--tree={tree}"]), ("again", [f"--tree={tree}"])):
            code, out, err = build([*inputs, f"--modules={modules_dir}",
                                    f"--out-dir={tmp_path / name}", "--output=json"])
            assert code == 0, err
            digests.append(json.loads(out)["digest"])
        assert len(set(digests)) == 1

    @pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
    def test_debs_of_every_compression_dpkg_writes_give_the_same_digest(
            self, tmp_path: Path, modules_dir: Path, compression: str) -> None:
        """Debian's packages (xz) packed again by dpkg-deb as Ubuntu packs its own (zstd),
        and gzip and none: the same files, so the same package as the extracted tree."""
        debs = [repack_deb(deb, compression, tmp_path)
                for deb in artifacts.nvidia_debs(VERSION).values()]
        member = {"zstd": "data.tar.zst", "gzip": "data.tar.gz", "none": "data.tar"}
        assert all(member[compression] in _ar_names(deb) for deb in debs)
        digests = []
        for name, inputs in (("debs", [f"--deb={d}" for d in debs]),
                             ("tree", [f"--tree={artifacts.nvidia_tree(VERSION)}"])):
            code, out, err = build([*inputs, f"--modules={modules_dir}",
                                    f"--out-dir={tmp_path / name}", "--output=json"])
            assert code == 0, err
            digests.append(json.loads(out)["digest"])
        assert digests[0] == digests[1]


def _ar_names(deb: Path) -> list[str]:
    return subprocess.run(["ar", "t", str(deb)], capture_output=True, text=True,
                          check=True).stdout.split()


class TestFromRunFile:
    """NVIDIA's .run format: a makeself archive, unpacked with --noexec --target."""

    def test_run_gives_the_same_user_files_as_the_debs_plus_firmware(
            self, tmp_path: Path, run_file: Path, modules_dir: Path) -> None:
        code, _, err = build([f"--run={run_file}", f"--modules={modules_dir}",
                              f"--out-dir={tmp_path / 'run'}", f"--tarball={tmp_path / 'p.tgz'}"])
        assert code == 0, err
        code, _, err = build([f"--tree={artifacts.nvidia_tree(VERSION)}",
                              f"--modules={modules_dir}", f"--out-dir={tmp_path / 'deb'}"])
        assert code == 0, err
        from_run = parse_manifest((tmp_path / "run" / "manifest.json").read_bytes())
        from_deb = parse_manifest((tmp_path / "deb" / "manifest.json").read_bytes())
        firmware = from_run.file(f"firmware/nvidia/{VERSION}/gsp_ga10x.bin")
        assert firmware.kind == "firmware"
        assert set(from_run.files) - {firmware} == set(from_deb.files)
        assert not any("installer" in entry.path for entry in from_run.files)

    def test_tarball_is_reproducible(self, tmp_path: Path, run_file: Path,
                                     modules_dir: Path) -> None:
        tarballs = []
        for name in ("one", "two"):
            code, _, err = build([f"--run={run_file}", f"--modules={modules_dir}",
                                  f"--out-dir={tmp_path / name}",
                                  f"--tarball={tmp_path / (name + '.tar.gz')}"])
            assert code == 0, err
            tarballs.append(sha256(tmp_path / f"{name}.tar.gz"))
        assert tarballs[0] == tarballs[1]


class TestSelection:
    """What a driver tree holds that a node does not need stays out of the package."""

    def test_installer_and_foreign_arch_binaries_are_left_out(self, tmp_path: Path) -> None:
        tree = tmp_path / "tree"
        tree.mkdir()
        source = tmp_path / "main.c"
        source.write_text("int main(void) { return 0; }\n")
        for name in ("nvidia-installer", "nvidia-settings", "nvidia-persistenced"):
            subprocess.run(["gcc", "-o", str(tree / name), str(source)], check=True)
        (tree / "nvidia-bug-report.sh").write_text("#!/bin/sh\n")
        (tree / "nvidia-bug-report.sh").chmod(0o755)
        code, out, err = build([f"--tree={tree}", f"--modules={make_modules(tmp_path / 'm')}",
                                f"--out-dir={tmp_path / 'out'}", "--output=json"])
        assert code == 0, err
        paths = {f["path"] for f in json.loads(out)["manifest"]["files"]}
        assert "bin/nvidia-persistenced" in paths
        assert not paths & {"bin/nvidia-installer", "bin/nvidia-settings",
                            "bin/nvidia-bug-report.sh"}

    def test_nothing_of_the_arch_or_a_foreign_module_is_refused(self, tmp_path: Path) -> None:
        tree = tmp_path / "tree"
        tree.mkdir()
        source = tmp_path / "main.c"
        source.write_text("int main(void) { return 0; }\n")
        subprocess.run(["gcc", "-o", str(tree / "nvidia-smi"), str(source)], check=True)
        identity = ["--driver-version=535.261.03", f"--kernel-release={KERNEL}",
                    "--flavour=proprietary", "--arch=aarch64"]
        code, _, err = build([f"--tree={tree}", *identity, f"--out-dir={tmp_path / 'a'}"])
        assert code == 2 and "hold no aarch64 driver files" in err
        mods = make_modules(tmp_path / "m")
        code, _, err = build([f"--modules={mods}", *identity, f"--out-dir={tmp_path / 'b'}"])
        assert code == 2 and "is built for x86_64, not aarch64" in err
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


class TestRepository:
    """Several packages accumulate in one index; aliases move only when asked."""

    def test_versions_and_kernels_accumulate(self, tmp_path: Path) -> None:
        repo = tmp_path / "repo"
        for version, alias in (("535.261.03", "--alias=default"), ("535.309.01", "--alias=latest"),
                               ("550.127.05", "--alias=550")):
            mods = make_modules(tmp_path / f"m-{version}", version=version)
            code, _, err = build([f"--modules={mods}", f"--repo={repo}", alias])
            assert code == 0, err
        index = parse_index((repo / "index.json").read_bytes())
        assert sorted(c.driver_version for c in index.packages) == [
            "535.261.03", "535.309.01", "550.127.05"]
        assert index.aliases == {"default": "535.261.03", "latest": "535.309.01",
                                 "550": "550.127.05"}

    def test_open_flavour_is_read_from_the_licence(self, tmp_path: Path) -> None:
        mods = make_modules(tmp_path / "open", licence="Dual MIT/GPL")
        code, _, err = build([f"--modules={mods}", f"--repo={tmp_path / 'repo'}"])
        assert code == 0, err
        assert (tmp_path / "repo" / KERNEL / VERSION / "open" / "manifest.json").is_file()


class TestCompressedModules:
    """Distributions compress modules; .modinfo is read through xz, gzip and zstd alike."""

    def test_xz_gz_and_zst_modules_keep_their_dependencies(self, tmp_path: Path) -> None:
        mods = make_modules(tmp_path / "mods")
        suffixes = [".xz", ".gz", ".zst"]
        for number, ko in enumerate(sorted(mods.glob("*.ko"))):
            # the real tools, as a kernel's `make modules_install` calls them
            suffix = suffixes[number % 3]
            tool = {".xz": ["xz"], ".gz": ["gzip"], ".zst": ["zstd", "-q", "--rm"]}[suffix]
            subprocess.run([*tool, str(ko)], check=True)
            assert ko.with_name(ko.name + suffix).is_file()
        code, out, err = build([f"--modules={mods}", f"--out-dir={tmp_path / 'out'}",
                                "--output=json"])
        assert code == 0, err
        modules = json.loads(out)["manifest"]["modules"]
        assert [m["name"] for m in modules] == [
            "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
        assert modules[3]["depends"] == ["nvidia", "nvidia_modeset", "drm_kms_helper", "drm"]
        shipped = [f["path"] for f in json.loads(out)["manifest"]["files"]
                   if f["kind"] == "module"]
        assert len(shipped) == 5  # nvidia-peermem too, shipped but not listed for loading
        assert {path.rsplit(".", 1)[1] for path in shipped} == {"xz", "gz", "zst"}

    def test_a_damaged_zst_module_is_one_line(self, tmp_path: Path) -> None:
        mods = make_modules(tmp_path / "mods")
        (mods / "nvidia.ko.zst").write_bytes(b"\x28\xb5\x2f\xfd not the rest of a frame")
        (mods / "nvidia.ko").unlink()
        code, _, err = build([f"--modules={mods}", f"--out-dir={tmp_path / 'out'}"])
        assert code == 2
        (line,) = err.strip().splitlines()
        assert "nvidia.ko.zst cannot be decompressed" in line and "; fix: " in line
        assert not (tmp_path / "out").exists()


class TestFetchReadsWhatBuildWrites:
    """The other end of the contract: `fetch` takes built packages from a mirror or preload."""

    def test_fetch_from_a_built_repository_over_http(
            self, tmp_path: Path, modules_dir: Path,
            make_node: Callable[[str], Path]) -> None:
        repo = tmp_path / "repo"
        code, _, err = build([f"--tree={artifacts.nvidia_tree(VERSION)}",
                              f"--modules={modules_dir}", f"--repo={repo}", "--alias=default"])
        assert code == 0, err
        node = make_node("debian12-l4")
        with MirrorServer(repo) as server:
            result = CliRunner().invoke(cli, ["fetch", *node_args(node), "--allow-http",
                                              f"--mirror={server.url}", "--output=json"])
        assert result.exit_code == 0, result.stderr
        manifest = parse_manifest((repo / KERNEL / VERSION / "proprietary" /
                                   "manifest.json").read_bytes())
        blobs = node / "home/kubernetes/bin/nvidia/.cache/blobs/sha256"
        assert {p.name for p in blobs.glob("*/*")} >= {e.sha256 for e in manifest.files}

    def test_fetch_from_a_preloaded_tarball(self, tmp_path: Path, run_file: Path,
                                            modules_dir: Path,
                                            make_node: Callable[[str], Path]) -> None:
        preloaded = tmp_path / "preloaded"
        tarball = preloaded / KERNEL / VERSION / "proprietary.tar.gz"
        code, _, err = build([f"--run={run_file}", f"--modules={modules_dir}",
                              f"--out-dir={tmp_path / 'pkg'}", f"--tarball={tarball}"])
        assert code == 0, err
        node = make_node("debian12-l4")
        result = CliRunner().invoke(cli, ["fetch", *node_args(node),
                                          f"--preloaded-dir={preloaded}", "--output=json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["driver_version"] == VERSION


class TestBadInput:
    """Each refusal: exit 2, one line naming the problem and the fix, nothing written."""

    @pytest.fixture
    def inputs(self, tmp_path: Path) -> Path:
        root = tmp_path / "inputs"
        root.mkdir()
        (root / "not-a.run").write_text("#!/bin/sh\necho hello\n")
        (root / "not-a.deb").write_bytes(b"PK\x03\x04 a zip file")
        cycle = root / "cycle"
        cycle.mkdir()
        compile_module(cycle, "nvidia", "nvidia_uvm", "NVIDIA")
        compile_module(cycle, "nvidia-uvm", "nvidia", "NVIDIA")
        make_modules(root / "mods")
        (root / "existing").mkdir()
        (root / "existing" / "keep").write_text("mine")
        return root

    @pytest.mark.parametrize(("args", "expected"), [
        ([], "nothing to build from"),
        (["--run={i}/not-a.run", "--out-dir={o}"], "not a makeself .run archive"),
        (["--deb={i}/not-a.deb", "--out-dir={o}"], "not a Debian package"),
        (["--modules={i}/cycle", "--out-dir={o}"], "cycle"),
        (["--modules={i}/cycle", "--repo={o}/repo"], "cycle"),
        (["--modules={i}/mods", "--driver-version=550.54.14", "--out-dir={o}"],
         "--driver-version 550.54.14 disagrees with the inputs"),
        (["--modules={i}/mods"], "exactly one of --out-dir or --repo"),
        (["--modules={i}/mods", "--out-dir={o}", "--alias=default"], "--alias needs --repo"),
        (["--modules={i}/mods", "--out-dir={i}/existing"], "already exists"),
    ])
    def test_refused_with_one_line_and_nothing_written(
            self, tmp_path: Path, inputs: Path, args: list[str], expected: str) -> None:
        before = tree_listing(tmp_path)
        argv = [a.format(i=inputs, o=tmp_path / "out") for a in args]
        code, _, err = build(argv)
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and "; fix: " in lines[0], err
        assert tree_listing(tmp_path) == before

    def test_truncated_run_file_is_refused(self, tmp_path: Path, run_file: Path) -> None:
        broken = tmp_path / "broken.run"
        broken.write_bytes(run_file.read_bytes()[: run_file.stat().st_size // 2])
        before = tree_listing(tmp_path)
        code, _, err = build([f"--run={broken}", f"--out-dir={tmp_path / 'out'}"])
        assert code == 2 and "is truncated" in err
        assert tree_listing(tmp_path) == before
