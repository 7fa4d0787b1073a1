"""`package build` of many kernels and both flavours in one command: NVIDIA's real sources.

(a) bookworm's real 535.261.03 `nvidia-kernel-source` compiled for two bookworm kernel
releases in one command into one repository; (b) trixie's real 550.163.01
`nvidia-kernel-source` and `nvidia-open-kernel-source` compiled with `--flavour both`
against bookworm's headers (the open tree with the `pci_resize_resource` patch), and each
flavour's `nvidia.ko` loaded in the guest, where it fails with ENODEV (no GPU). Both
repositories are cached under the kernel's dir, keyed by the inputs' and the build code's
digests, like `assets.build_nvidia_cli`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from installer.node import kmod
from installer.packages.manifest import parse_manifest

from . import guest, matrixrepos
from .assets import Kernel
from .conftest import REPO

pytestmark = pytest.mark.timeout(3600)
SECOND_RELEASE, PATCH = matrixrepos.SECOND_RELEASE, matrixrepos.PATCH


def _index(repo: Path) -> list[dict[str, Any]]:
    packages: list[dict[str, Any]] = json.loads((repo / "index.json").read_text())["packages"]
    return packages


@pytest.fixture(scope="session")
def two_kernels_repo(kernel: Kernel) -> Path:
    return matrixrepos.two_kernels_repo(kernel)


@pytest.fixture(scope="session")
def both_flavours_repo(kernel: Kernel) -> Path:
    return matrixrepos.both_flavours_repo(kernel)


def test_two_releases_of_535_in_one_repository(kernel: Kernel, two_kernels_repo: Path
                                               ) -> None:
    index = _index(two_kernels_repo)
    assert sorted((p["kernel_release"], p["flavour"], p["driver_version"]) for p in index) == [
        (SECOND_RELEASE, "proprietary", "535.261.03"),
        (kernel.release, "proprietary", "535.261.03")]
    for entry in index:
        directory = two_kernels_repo / entry["path"]
        data = (directory / "manifest.json").read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["manifest_sha256"]
        manifest = parse_manifest(data)
        assert manifest.kernel_release == entry["kernel_release"]
        for ko in sorted((directory / "modules").glob("*.ko")):
            vermagic = kmod.modinfo(ko.read_bytes())["vermagic"][0].split()[0]
            assert vermagic == entry["kernel_release"], ko
        assert manifest.provenance is not None
        assert {h["name"] for h in manifest.provenance["kernel_headers"]} == {
            f"linux-headers-{entry['kernel_release']}",
            f"linux-headers-{entry['kernel_release'][:-6]}-common", "linux-kbuild-6.1"}


def test_both_flavours_of_550_load_and_find_no_gpu(kernel: Kernel, both_flavours_repo: Path,
                                                   tmp_path: Path) -> None:
    index = _index(both_flavours_repo)
    assert sorted((p["kernel_release"], p["flavour"]) for p in index) == [
        (kernel.release, "open"), (kernel.release, "proprietary")]
    dirs = {p["flavour"]: both_flavours_repo / p["path"] for p in index}
    licences = {f: kmod.modinfo((d / "modules" / "nvidia.ko").read_bytes())["license"][0]
                for f, d in dirs.items()}
    assert licences == {"open": "Dual MIT/GPL", "proprietary": "NVIDIA"}
    open_manifest = parse_manifest((dirs["open"] / "manifest.json").read_bytes())
    assert open_manifest.provenance is not None
    assert open_manifest.provenance["nvidia_source"]["name"] == "nvidia-open-kernel-source"
    assert [p["name"] for p in open_manifest.provenance["patches"]] == [PATCH.name]
    (tmp_path / "args.json").write_text(json.dumps({
        "version": "550.163.01", "packages": {f: str(d / "modules") for f, d in dirs.items()}}))
    result = guest.run_in_guest(
        'python3 tests/kernel/scenarios.py flavours "$GNI_OUT/args.json" '
        '"$GNI_OUT/results.json"\n'.replace("python3", sys.executable),
        kernel=kernel, timeout=600, cwd=REPO, env={"PYTHONPATH": str(REPO)}, out_dir=tmp_path)
    assert result.rc == 0, result.describe()
    data = result.json("results.json")
    for flavour in ("open", "proprietary"):
        error = data[flavour]["error"]
        assert error["type"] == "NoGpuRespondedError", (flavour, error)
        assert "no NVIDIA GPU responded" in error["message"]
        assert data[flavour]["after"]["modules"] == data["before"]["modules"], flavour
