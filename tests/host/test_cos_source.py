"""The `cos` source end to end: a COS node, Google's bucket layout served over HTTPS.

The bucket (tests/cosbucket.py) holds signed prebuilt modules in a `--xattrs` tarball, version
files, and a real makeself runfile with NVIDIA's layout from Debian's real 535 files (NVML and
CUDA replaced by the C stand-ins so `verify` runs the real pynvml); every response carries
Cloud Storage's `x-goog-hash`. The kernel is simulated (tests/fakenode.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cosbucket import CosBucket, cos_node, make_bucket
from cosserver import CosServer
from e2e import events, run_cli, standin_env
from helpers import node_args, tree_listing
from native import build_standins

from installer.packages.ima import XATTR
from installer.packages.manifest import parse_manifest
from installer.testing import SAMPLE_NODES, NodeSpec, PciSpec

VERSION = "535.261.03"
NODE = SAMPLE_NODES["gke-cos-a100x8"]
BUILD = "17800.218.20"  # the sample node's BUILD_ID
INSTALL = "home/kubernetes/bin/nvidia"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> CosBucket:
    base = tmp_path_factory.mktemp("cos")
    standins = build_standins(base / "standins")
    return make_bucket(base, build_id=BUILD, kernel_release=NODE.kernel, version=VERSION,
                       standins=standins)


@pytest.fixture
def server(bucket: CosBucket) -> Iterator[CosServer]:
    with CosServer(bucket.root) as running:
        yield running


def _node(tmp_path: Path, spec: NodeSpec = NODE) -> Path:
    return cos_node(tmp_path / "node", spec)


def _args(root: Path, server: CosServer, command: str = "install", *extra: str) -> list[str]:
    assert server.ca_bundle is not None
    return [command, *node_args(root), "--log-format", "json",
            "--cos-tools-url", server.cos_tools_url, "--nvidia-runfile-url",
            server.runfile_url, "--ca-bundle", str(server.ca_bundle), *extra]


def _install(root: Path, server: CosServer, *extra: str) -> tuple[int, str, str]:
    # the sample A100 node has NVSwitches and COS's artifacts no Fabric Manager: the
    # gke-cos overlay's FABRIC_MANAGER=host
    done = run_cli(_args(root, server, "install", "--fabric-manager", "host", *extra),
                   standin_env(VERSION, gpus=8))
    return done.returncode, done.stdout, done.stderr


class TestInstall:
    """resolve -> assemble -> load -> stage -> verify -> signal, then the offline fast path."""

    def test_install_reaches_ready_then_fast_path_offline(self, tmp_path: Path,
                                                         bucket: CosBucket) -> None:
        root = _node(tmp_path)
        with CosServer(bucket.root) as server:
            code, _, err = _install(root, server)
            assert code == 0, err
            assert any(e.get("event") == "package assembled" for e in events(err))
            args = _args(root, server, "install", "--fabric-manager", "host")
            assert server.ca_bundle is not None
            ca = tmp_path / "ca.pem"
            ca.write_bytes(server.ca_bundle.read_bytes())
        args[args.index("--ca-bundle") + 1] = str(ca)
        install = root / INSTALL
        ready = json.loads((install / ".ready.json").read_text())
        assert ready["driver_version"] == VERSION
        for name, data in bucket.signed.items():  # Google's signed modules, byte for byte
            assert (install / "drivers" / name).read_bytes() == data
        for name, data in bucket.firmware.items():
            staged = install / "firmware" / "nvidia" / VERSION / name
            assert staged.read_bytes() == data
            assert os.getxattr(staged, XATTR) == bucket.ima[
                f"firmware/nvidia/{VERSION}/{name}"]
        assert (install / "lib64" / f"libnvidia-ml.so.{VERSION}").is_file()
        assert not (install / "lib64" / "nvidia-installer").exists()
        # the reboot: same node, the bucket's server gone
        done = run_cli(args, standin_env(VERSION, gpus=8))
        code, out, err = done.returncode, done.stdout, done.stderr
        assert code == 0, err
        assert any(e.get("fast_path") is True for e in events(err)) or "fast path" in out, err

    def test_dropped_runfile_resumes_and_is_still_checked(self, tmp_path: Path,
                                                          bucket: CosBucket,
                                                          server: CosServer) -> None:
        from httpserver import Fault

        server.fault(bucket.runfile_path, Fault("drop", after=1 << 20))
        code, _, err = _install(_node(tmp_path), server)
        assert code == 0, err
        asked = server.requests_for(bucket.runfile_path)
        assert [r.range for r in asked] == [None, "bytes=1048576-"], asked

    def test_versions_lists_the_build_offer(self, tmp_path: Path, server: CosServer) -> None:
        root = _node(tmp_path)
        done = run_cli(_args(root, server, "versions", "--output", "json"),
                       standin_env(VERSION))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        cos = [s for s in report["sources"] if s["source"].startswith("cos ")]
        assert len(cos) == 1 and cos[0]["error"] is None
        assert cos[0]["aliases"]["default"] == VERSION
        assert cos[0]["aliases"]["535"] == VERSION
        assert cos[0]["versions"] == {VERSION: ["open"]}
        assert report["resolved"] == f"{VERSION} (open)"
        assert f"build {BUILD}" in cos[0]["source"]
        # nothing but version files was asked for
        assert all("_version" in r.path for r in server.requests)
        text = run_cli(_args(root, server, "versions"), standin_env(VERSION)).stdout
        assert f"aliases: 535 -> {VERSION}, default -> {VERSION}, latest -> {VERSION}" in text
        assert f"default -> {VERSION} (open)" in text


def _failing(tmp_path: Path, server: CosServer) -> tuple[int, str, Path]:
    root = _node(tmp_path)
    before = tree_listing(root / "home")
    code, _, err = _install(root, server)
    last = [line for line in err.splitlines() if line.strip()][-1]
    written = set(tree_listing(root / "home")) - set(before)
    work_area = {"kubernetes", "kubernetes/bin", INSTALL.removeprefix("home/")}
    assert written <= work_area | {f"kubernetes/bin/nvidia/{p}" for p in (
        ".cache", ".cache/tmp", ".lock", ".last-install.json")}, written  # lock, record, empty dir
    return code, last, root


class TestRefusals:
    """Broken artifacts: one clear line, a documented exit code, nothing staged."""

    def test_wrong_crc32c_on_the_modules(self, tmp_path: Path, bucket: CosBucket,
                                         server: CosServer) -> None:
        server.lie(bucket.tarball_path, crc32c=True)
        code, line, _ = _failing(tmp_path, server)
        assert code == 7 and "crc32c" in line and "Cloud Storage says" in line, line

    def test_missing_hash_header(self, tmp_path: Path, bucket: CosBucket,
                                 server: CosServer) -> None:
        server.lie(bucket.runfile_path, missing=True)
        code, line, _ = _failing(tmp_path, server)
        assert code == 7 and "x-goog-hash" in line, line

    def test_no_version_file(self, tmp_path: Path, bucket: CosBucket) -> None:
        other = make_bucket(tmp_path / "b", build_id="17800.1.1", runfile=False)
        with CosServer(other.root) as server:
            code, line, _ = _failing(tmp_path, server)
        assert code == 5 and "gpu_*_version" in line, line

    def test_modules_tarball_404(self, tmp_path: Path, bucket: CosBucket,
                                 server: CosServer) -> None:
        from httpserver import Fault

        server.mirror.fault(bucket.tarball_path, Fault("status", status=404, times=0))
        code, line, _ = _failing(tmp_path, server)
        assert code == 5 and "no prebuilt modules" in line, line

    def test_alias_pointing_at_a_missing_version(self, tmp_path: Path) -> None:
        other = make_bucket(tmp_path / "b", build_id=BUILD, kernel_release=NODE.kernel,
                            runfile=False)
        other.write_alias("default", "535.999.01")
        with CosServer(other.root) as server:
            code, line, _ = _failing(tmp_path, server)
        assert code == 5 and "535.999.01" in line and "no prebuilt modules" in line, line

    def test_firmware_differing_from_the_runfile(self, tmp_path: Path) -> None:
        """A signature signs one file: the tarball's firmware must be the runfile's."""
        from cosbucket import read_tgz, write_tgz, xattr_bytes

        other = make_bucket(tmp_path / "b", build_id=BUILD, kernel_release=NODE.kernel,
                            version=VERSION, standins=build_standins(tmp_path / "standins"))
        members = []
        for name, (info, data) in read_tgz(other.tarball).items():
            xattrs = {"security.ima": x} if (x := xattr_bytes(info)) else {}
            if name.endswith("gsp_ga10x.bin") and data is not None:
                data = data[:-1] + bytes([data[-1] ^ 1])
            members.append((name, data, xattrs))
        write_tgz(other.tarball, members)
        with CosServer(other.root) as server:
            code, line, _ = _failing(tmp_path, server)
        assert code == 7 and "gsp_ga10x.bin differs" in line, line

    def test_proprietary_only_gpus_are_refused_before_any_request(
            self, tmp_path: Path, server: CosServer) -> None:
        v100 = NodeSpec(os="cos", kernel=NODE.kernel,
                        pci=(PciSpec("0000:00:04.0", 0x1DB4, 0x030200, driver=None),),
                        extra_files=NODE.extra_files)
        root = _node(tmp_path, v100)
        code, _, err = _install(root, server)
        assert code == 14, err
        assert "GKE's own installer" in err and "proprietary" in err
        assert server.requests == []


class TestBesideMirrors:
    """The cos source sits after the cache and before DRIVER_MIRRORS."""

    def test_unreachable_bucket_falls_through_to_a_mirror(self, tmp_path: Path) -> None:
        from packages import write_index, write_package

        repo = tmp_path / "repo"
        write_package(repo, kernel=NODE.kernel, version=VERSION, flavour="open")
        write_index(repo, {"default": VERSION})
        done = run_cli(["fetch", *node_args(_node(tmp_path)), "--log-format", "json",
                        "--cos-tools-url", "https://127.0.0.1:9/cos-tools",
                        "--download-retries", "1", "--mirror", f"file://{repo}",
                        "--output", "json"], dict(os.environ))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["source"] == f"mirror file://{repo}"
        unavailable = [e for e in events(done.stderr) if e["event"] == "source unavailable"]
        assert [str(e["source"]).split()[0] for e in unavailable] == ["cos"], unavailable

    def test_cos_source_never(self, tmp_path: Path, server: CosServer) -> None:
        done = run_cli(_args(_node(tmp_path), server, "versions", "--output", "json",
                             "--cos-source", "never"), dict(os.environ))
        report = json.loads(done.stdout)
        assert not [s for s in report["sources"] if s["source"].startswith("cos ")]
        assert server.requests == []


class TestPackageBuild:
    """`package build --cos-build` makes the same package ahead of time."""

    def test_out_dir_and_repo(self, tmp_path: Path, bucket: CosBucket,
                              server: CosServer) -> None:
        assert server.ca_bundle is not None
        common = ["package", "build", "--cos-build", BUILD, "--cos-tools-url",
                  server.cos_tools_url, "--nvidia-runfile-url", server.runfile_url,
                  "--ca-bundle", str(server.ca_bundle), "--driver-version", "R535"]
        done = run_cli([*common, "--out-dir", str(tmp_path / "pkg")], dict(os.environ))
        assert done.returncode == 0, done.stderr
        manifest = parse_manifest((tmp_path / "pkg" / "manifest.json").read_bytes())
        assert (manifest.driver_version, manifest.kernel_release, manifest.flavour) == (
            VERSION, NODE.kernel, "open")
        assert manifest.os == {"id": "cos", "build_id": BUILD}
        assert {e.file for e in manifest.ima} == {
            f"firmware/nvidia/{VERSION}/{n}" for n in bucket.firmware}
        assert [m.name for m in manifest.modules][:2] == ["nvidia", "nvidia_uvm"]
        done = run_cli([*common, "--repo", str(tmp_path / "repo"), "--alias", "default"],
                       dict(os.environ))
        assert done.returncode == 0, done.stderr
        index = json.loads((tmp_path / "repo" / "index.json").read_text())
        assert index["aliases"]["default"] == VERSION

    def test_bad_flags_are_refused_before_any_request(self, tmp_path: Path,
                                                      server: CosServer) -> None:
        cases = [(["--cos-build", "../x", "--out-dir", "o"], "COS build id"),
                 (["--cos-build", BUILD], "exactly one of --out-dir or --repo"),
                 (["--cos-build", BUILD, "--out-dir", "o", "--cos-tools-url",
                   "http://127.0.0.1:1/x"], "https://"),
                 (["--cos-build", BUILD, "--out-dir", "o", "--driver-version", "newest"],
                  "--driver-version")]
        for extra, expected in cases:
            done = run_cli(["package", "build", *extra], dict(os.environ))
            assert done.returncode == 2, done.stderr
            assert expected in done.stderr.strip().splitlines()[-1], done.stderr
        assert server.requests == []
