"""Each node gets its own arch: a mixed repository over HTTP, wrong-arch packages refused.

The nodes are host trees whose /proc/sys/kernel/arch says x86_64, aarch64 or arm64 (the
spelling some tools use), all with the same kernel release (Ubuntu and COS publish one
release for both arches), so only the arch tells their packages apart. The CLI runs in a
subprocess against a real HTTP mirror (tests/httpserver.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from installer.packages.repository import parse_index
from installer.testing import SAMPLE_NODES, build_node
from tests.httpserver import MirrorServer
from tests.packages import tar_package, write_index, write_package

VERSION = "535.261.03"
SAMPLE = SAMPLE_NODES["gke-ubuntu-t4"]  # a Turing GPU: both flavours fit
KERNEL = SAMPLE.kernel
LIB = f"lib64/libnvidia-ml.so.{VERSION}"
REPO_ROOT = Path(__file__).resolve().parents[2]


def files_for(arch: str) -> dict[str, bytes]:
    """Files whose bytes say which arch's package they came from."""
    return {LIB: f"\x7fELF {arch} nvml ".encode() * 100, "bin/nvidia-smi": b"#!/bin/sh\n",
            "modules/nvidia.ko": f"{arch} nvidia module".encode() * 50}


def node(tmp_path: Path, name: str, arch: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    return build_node(root, dataclasses.replace(SAMPLE, arch=arch))


def cli(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, pointed at a host tree."""
    base = ["--host-root", str(host), "--proc-root", str(host / "proc"), "--sys-root",
            str(host / "sys"), "--log-format", "json",
            "--termination-log", str(host.parent / f"{host.name}-termination-log")]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "installer", args[0], *base, *args[1:]],
                          capture_output=True, text=True, env=env, check=False, timeout=300)


def cached_lib(host: Path, arch: str) -> Path:
    digest = hashlib.sha256(files_for(arch)[LIB]).hexdigest()
    return host / "home/kubernetes/bin/nvidia/.cache/blobs/sha256" / digest[:2] / digest


@pytest.fixture
def mixed_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for arch in ("x86_64", "aarch64"):
        write_package(repo, kernel=KERNEL, version=VERSION, arch=arch, files=files_for(arch))
    write_index(repo, {"default": VERSION})
    return repo


class TestMixedRepository:
    def test_index_lists_both_arches_at_their_own_paths(self, mixed_repo: Path) -> None:
        index = parse_index((mixed_repo / "index.json").read_bytes())
        assert sorted((c.arch, c.path) for c in index.packages) == [
            ("aarch64", f"{KERNEL}/{VERSION}/proprietary-aarch64"),
            ("x86_64", f"{KERNEL}/{VERSION}/proprietary")]

    def test_each_node_fetches_its_own_arch(self, tmp_path: Path, mixed_repo: Path) -> None:
        hosts = {"x86_64": node(tmp_path, "amd", "x86_64"),
                 "aarch64": node(tmp_path, "arm", "aarch64")}
        with MirrorServer(mixed_repo) as server:
            results = {arch: cli(host, "fetch", "--mirror", server.url, "--allow-http",
                                 "--output", "json") for arch, host in hosts.items()}
        for arch, result in results.items():
            assert result.returncode == 0, result.stderr
            out = json.loads(result.stdout)
            assert (out["arch"], out["kernel_release"], out["driver_version"]) == (
                arch, KERNEL, VERSION)
            other = "x86_64" if arch == "aarch64" else "aarch64"
            assert cached_lib(hosts[arch], arch).read_bytes() == files_for(arch)[LIB]
            assert not cached_lib(hosts[arch], other).exists()

    def test_arm64_spelling_of_the_kernel_arch_is_aarch64(self, tmp_path: Path,
                                                           mixed_repo: Path) -> None:
        host = node(tmp_path, "arm", "arm64")
        detected = cli(host, "detect", "--output", "json")
        assert detected.returncode == 0, detected.stderr
        assert json.loads(detected.stdout)["kernel"]["arch"] == "aarch64"
        with MirrorServer(mixed_repo) as server:
            result = cli(host, "fetch", "--mirror", server.url, "--allow-http",
                         "--output", "json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["arch"] == "aarch64"

    def test_only_another_arch_offered_is_not_found(self, tmp_path: Path) -> None:
        repo = tmp_path / "repo"
        write_package(repo, kernel=KERNEL, version=VERSION, arch="aarch64",
                      files=files_for("aarch64"))
        write_index(repo, {"default": VERSION})
        host = node(tmp_path, "amd", "x86_64")
        with MirrorServer(repo) as server:
            result = cli(host, "fetch", "--mirror", server.url, "--allow-http")
        assert result.returncode == 5, result.stderr
        assert "packages for aarch64 are never used on a x86_64 node" in result.stderr
        assert not cached_lib(host, "aarch64").exists()


class TestPreloadedWrongArch:
    """A preloaded directory without index.json: the path says no arch, the manifest does."""

    @staticmethod
    def preloaded(tmp_path: Path, *, tarball: bool) -> Path:
        """An aarch64 package at the plain `<flavour>` path an x86_64 node would take."""
        built = tmp_path / "built"
        write_package(built, kernel=KERNEL, version=VERSION, arch="aarch64",
                      files=files_for("aarch64"))
        tree = built / KERNEL / VERSION / "proprietary-aarch64"
        target = tmp_path / "preloaded" / KERNEL / VERSION / "proprietary"
        target.parent.mkdir(parents=True)
        if tarball:
            tar_package(tree, target.with_name("proprietary.tar.gz"))
        else:
            shutil.copytree(tree, target)
        return tmp_path / "preloaded"

    @pytest.mark.parametrize("tarball", [False, True], ids=["tree", "tarball"])
    def test_refused_with_exit_7_naming_both_arches(self, tmp_path: Path,
                                                     tarball: bool) -> None:
        preloaded = self.preloaded(tmp_path, tarball=tarball)
        host = node(tmp_path, "amd", "x86_64")
        result = cli(host, "fetch", "--preloaded-dir", str(preloaded))
        assert result.returncode == 7, result.stderr
        error = [line for line in result.stderr.splitlines() if line.startswith("error(")]
        assert len(error) == 1 and "aarch64" in error[0] and "x86_64" in error[0], error
        assert not cached_lib(host, "aarch64").exists()

    def test_the_same_package_serves_an_aarch64_node(self, tmp_path: Path) -> None:
        preloaded = self.preloaded(tmp_path, tarball=True)
        host = node(tmp_path, "arm", "aarch64")
        result = cli(host, "fetch", "--preloaded-dir", str(preloaded), "--output", "json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["arch"] == "aarch64"
        assert cached_lib(host, "aarch64").read_bytes() == files_for("aarch64")[LIB]

    def test_a_mirror_after_it_delivers_the_right_arch(self, tmp_path: Path,
                                                       mixed_repo: Path) -> None:
        preloaded = self.preloaded(tmp_path, tarball=False)
        host = node(tmp_path, "amd", "x86_64")
        with MirrorServer(mixed_repo) as server:
            result = cli(host, "fetch", "--preloaded-dir", str(preloaded), "--mirror",
                         server.url, "--allow-http", "--output", "json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["arch"] == "x86_64"
        assert "manifest is for" in result.stderr  # the preloaded one was refused, logged
        assert not cached_lib(host, "aarch64").exists()
