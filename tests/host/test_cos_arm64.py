"""The `cos` source on an arm64 COS node (GKE A4X and other Grace nodes): the lakitu-arm64
board's artifacts and NVIDIA's aarch64 runfile, from the test COS bucket over HTTPS.

The bucket (tests/cosbucket.py) holds, under `<BUILD_ID>/lakitu-arm64/`, signed aarch64
open modules (cross-compiled with the `.modinfo` NVIDIA's open modules carry) and, in the
runfile bucket, `NVIDIA-Linux-aarch64-<v>.run` made from Debian's real arm64 535 files
(tests/arm64debs.py) with the bucket's firmware. The node is a GH200 on COS arm64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import arm64debs
import pytest
from cosbucket import RUNFILE_BUCKET, CosBucket, cos_node, make_bucket
from cosserver import CosServer

from installer.node import elf
from installer.packages.cache import Cache
from installer.packages.manifest import parse_manifest
from installer.testing import COS_LSB_RELEASE, NodeSpec, PciSpec

VERSION = "535.261.03"
KERNEL = "6.6.72+"
BUILD = "17800.218.20"
BOARD = "lakitu-arm64"
OPEN_DEPENDS = {"nvidia": "", "nvidia-uvm": "nvidia", "nvidia-modeset": "nvidia",
                "nvidia-drm": "nvidia,nvidia-modeset,drm_kms_helper,drm"}
GH200 = PciSpec("0009:01:00.0", 0x2342, 0x030200, driver=None)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> CosBucket:
    base = tmp_path_factory.mktemp("cos-arm64")
    modules = arm64debs.aarch64_modules(base / "modules", version=VERSION, kernel=KERNEL,
                                        licence="Dual MIT/GPL", depends=OPEN_DEPENDS)
    made = make_bucket(base, build_id=BUILD, board=BOARD, kernel_release=KERNEL,
                       version=VERSION, modules_dir=modules, runfile=False)
    # NVIDIA's aarch64 runfile in the runfile bucket, with the modules tarball's firmware
    runfile = f"{RUNFILE_BUCKET}/tesla/{VERSION}/NVIDIA-Linux-aarch64-{VERSION}.run"
    (made.root / runfile).parent.mkdir(parents=True)
    made.runfile = arm64debs.make_runfile(made.root / runfile, VERSION, made.firmware)
    return made


def arm64_cos_node(tmp_path: Path, arch: str = "aarch64") -> Path:
    lsb = COS_LSB_RELEASE.replace("lakitu-signed-prempkeys", f"{BOARD}-signed-prempkeys")
    spec = NodeSpec(os="cos", kernel=KERNEL, arch=arch, pci=(GH200,),
                    extra_files={"etc/lsb-release": lsb})
    return cos_node(tmp_path / "node", spec)


def fetch(root: Path, server: CosServer, *extra: str) -> subprocess.CompletedProcess[str]:
    assert server.ca_bundle is not None
    args = ["fetch", "--host-root", str(root), "--proc-root", str(root / "proc"),
            "--sys-root", str(root / "sys"), "--log-format", "json",
            "--termination-log", str(root.parent / "termination-log"),
            "--cos-tools-url", server.cos_tools_url, "--nvidia-runfile-url",
            server.runfile_url, "--ca-bundle", str(server.ca_bundle), *extra]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "installer", *args], capture_output=True,
                          text=True, env=env, check=False, timeout=300)


class TestCosArm64:
    def test_arm64_node_assembles_an_aarch64_package_from_the_arm64_board(
            self, tmp_path: Path, bucket: CosBucket) -> None:
        root = arm64_cos_node(tmp_path)
        with CosServer(bucket.root) as server:
            result = fetch(root, server, "--output", "json")
            runfile_gets = server.requests_for(
                f"/{RUNFILE_BUCKET}/tesla/{VERSION}/NVIDIA-Linux-aarch64-{VERSION}.run")
            board_gets = [r for r in server.requests
                          if f"/{BUILD}/{BOARD}/nvidia-drivers-{VERSION}.tgz" in str(r)]
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert (out["arch"], out["flavour"], out["kernel_release"]) == (
            "aarch64", "open", KERNEL)
        assert runfile_gets and board_gets
        cache = Cache(root / "home/kubernetes/bin/nvidia/.cache")
        data = cache.manifest_data(out["digest"])
        assert data is not None
        manifest = parse_manifest(data)
        assert manifest.arch == "aarch64" and manifest.os == {"id": "cos", "build_id": BUILD}
        elves = [e for e in manifest.files if e.kind in ("library", "binary", "module")]
        assert {e.kind for e in elves} == {"library", "binary", "module"}
        for entry in elves:
            head = cache.blob(entry.sha256).read_bytes()[:20]
            assert elf.machine(head) == "aarch64", entry.path
        for module in (e for e in elves if e.kind == "module"):  # Google's signed bytes
            name = module.path.rsplit("/", 1)[-1]
            assert cache.blob(module.sha256).read_bytes() == bucket.signed[name]

    def test_x86_node_of_the_same_build_never_takes_the_arm64_runfile(
            self, tmp_path: Path, bucket: CosBucket) -> None:
        root = arm64_cos_node(tmp_path, arch="x86_64")
        with CosServer(bucket.root) as server:
            result = fetch(root, server)
            arm_gets = server.requests_for(
                f"/{RUNFILE_BUCKET}/tesla/{VERSION}/NVIDIA-Linux-aarch64-{VERSION}.run")
        assert result.returncode != 0
        assert "NVIDIA-Linux-x86_64-535.261.03.run" in result.stderr
        assert not arm_gets
