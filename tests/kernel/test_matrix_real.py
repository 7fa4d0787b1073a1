"""`package build` of many kernels and both flavours in one command: NVIDIA's real sources.

Each compile here proves what no other test does; what another test already compiled
comes from the product's `--compile-cache` (per compile: sources, headers, compiler,
patches), so the tier compiles it once:

(a) bookworm's real 535.261.03 `nvidia-kernel-source` for two bookworm kernel releases in
one command into one repository. New compile: 535 for SECOND_RELEASE (the many-kernel
path against a second release's real headers: each package's vermagic and headers are its
own). The tier's kernel's compile is `assets.build_nvidia_cli`'s, from the cache.
(b) bookworm's real 535.261.03 `nvidia-kernel-source` and `nvidia-open-kernel-source` with
`--flavour both --patch` for the tier's kernel (the `pci_resize_resource` fix 6.1.0-57 needs,
arm64cross.OPEN_PCI_RESIZE_PATCH: it goes to the open tree only, the proprietary one has
nothing to patch), and each flavour's `nvidia.ko` loaded in the guest, where it fails with
ENODEV (no GPU). New compile: the open 535 for x86 (NVIDIA's open tree, patched, through the
many-build path: the only native open compile for the bookworm kernel); the proprietary one
is again `build_nvidia_cli`'s, from the cache.

Proven elsewhere, not compiled here: trixie's 550 (open, with the shipped patch, compiled
in its build root and loaded in its own kernel, and failing without the patch:
test_buildroot_real.py); the arm64 cross path (test_cross_arm64_real.py). Both
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
SECOND_RELEASE = matrixrepos.SECOND_RELEASE
VERSION = "535.261.03"
PATCH_NAME = "open-535-pci-resize-resource.patch"


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


def test_both_flavours_of_535_load_and_find_no_gpu(kernel: Kernel, both_flavours_repo: Path,
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
    assert [p["name"] for p in open_manifest.provenance["patches"]] == [PATCH_NAME]
    proprietary = parse_manifest((dirs["proprietary"] / "manifest.json").read_bytes())
    assert proprietary.provenance is not None
    assert proprietary.provenance["patches"] == []  # the fix has nothing to patch there
    (tmp_path / "args.json").write_text(json.dumps({
        "version": VERSION, "packages": {f: str(d / "modules") for f, d in dirs.items()}}))
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

