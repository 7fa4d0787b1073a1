"""`package build --nvidia-source --kernel-headers`: NVIDIA's real 535 compiled by the CLI.

The `nvidia_package` fixture runs `gpu-node-installer package build` in a subprocess on
bookworm's real `nvidia-kernel-source` .deb and Debian 6.1's real headers .debs (arch,
-common, linux-kbuild), cached by the inputs' digests. Those same modules are what
test_load_kernel.py's guest loads (and sees fail with ENODEV, "no NVIDIA GPU responded"),
so the compiled package is proven loadable by the kernel it was built for without a boot
of its own. Reproducibility is proven here on a small real compile (NVIDIA-shaped
sources, the same real headers .debs, the same code path), built twice cold in different
directories with different -j: byte-identical .ko files and the same package digest.
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from nvsources import mini_source

from installer.node import kmod
from installer.packages.manifest import parse_manifest

from . import assets
from .assets import Kernel

pytestmark = pytest.mark.timeout(1800)
VERSION = "535.261.03"
CLI = (sys.executable, "-m", "installer")  # the real CLI, in a subprocess
NAMES = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_compiled_package_identity_and_provenance(kernel: Kernel, nvidia_package: Path
                                                  ) -> None:
    manifest = parse_manifest((nvidia_package / "manifest.json").read_bytes())
    assert (manifest.kernel_release, manifest.driver_version, manifest.flavour) == (
        kernel.release, VERSION, "proprietary")
    assert [m.name for m in manifest.modules] == NAMES
    source = assets.nvidia_source_deb()
    headers = assets.headers_debs(kernel)
    provenance = manifest.provenance
    assert provenance is not None
    assert provenance["nvidia_source"] == {"name": "nvidia-kernel-source",
                                           "version": source.name.split("_")[1],
                                           "sha256": _sha(source)}
    assert sorted(h["sha256"] for h in provenance["kernel_headers"]) == sorted(
        _sha(h) for h in headers)
    assert {h["name"] for h in provenance["kernel_headers"]} == {
        f"linux-headers-{kernel.release}", f"linux-headers-{kernel.release[:-6]}-common",
        "linux-kbuild-6.1"}
    assert provenance["compiler"].startswith("gcc-12 (Debian 12.2.0")
    assert provenance["patches"] == []


def test_modules_have_the_kernels_vermagic_and_no_build_paths(kernel: Kernel,
                                                               nvidia_package: Path) -> None:
    modules = sorted((nvidia_package / "modules").glob("*.ko"))
    names = {kmod.normalize(kmod.modinfo(p.read_bytes())["name"][0]) for p in modules}
    assert names == {*NAMES, "nvidia_peermem"}
    for path in modules:
        info = kmod.modinfo(path.read_bytes())
        assert info["vermagic"][0].split()[0] == kernel.release, path.name
        assert info["version"] == [VERSION] or path.name == "nvidia-peermem.ko"
        text = subprocess.run(["strings", "-a", str(path)], capture_output=True, text=True,
                              check=True).stdout
        for leak in ("/tmp/", "gni-build", str(assets.cache_root()), "/root/"):
            assert leak not in text, f"{path.name} names {leak}"


def _cli_build(source: Path, headers: list[Path], out: Path, jobs: int) -> str:
    done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           *(f"--kernel-headers={h}" for h in headers), f"--jobs={jobs}",
                           f"--out-dir={out}", "--output=json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"event": "module compiled"' in done.stderr  # a JSON event per module (no tty)
    return str(parse_manifest((out / "manifest.json").read_bytes()).driver_version)


def test_two_cold_builds_are_byte_identical(kernel: Kernel, tmp_path: Path) -> None:
    headers = assets.headers_debs(kernel)
    outs = []
    for number, jobs in ((1, 1), (2, 2)):
        source = mini_source(tmp_path.joinpath(f"place{number}", *["deeper"] * number,
                                               "nvidia-src"))
        out = tmp_path / f"out{number}"
        assert _cli_build(source, headers, out, jobs) == VERSION
        outs.append(out)
    first, second = ((o / "manifest.json").read_bytes() for o in outs)
    assert first == second  # same package digest
    kos = sorted(p.name for p in (outs[0] / "modules").iterdir())
    assert len(kos) == 4
    for name in kos:
        assert (outs[0] / "modules" / name).read_bytes() == (
            outs[1] / "modules" / name).read_bytes(), name
        text = subprocess.run(["strings", "-a", str(outs[0] / "modules" / name)],
                              capture_output=True, text=True, check=True).stdout
        assert str(tmp_path) not in text and "/tmp/" not in text


def test_patch_is_applied_and_recorded(kernel: Kernel, tmp_path: Path) -> None:
    source = mini_source(tmp_path / "nvidia-src")
    patch = tmp_path / "0001-tag.patch"
    original = (source / "nvidia.c").read_text().splitlines(keepends=True)
    patched = [*original, 'MODULE_INFO(gni_patched, "yes");\n']
    patch.write_text("".join(difflib.unified_diff(original, patched, "a/nvidia.c",
                                                  "b/nvidia.c")))
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           *(f"--kernel-headers={h}" for h in assets.headers_debs(kernel)),
                           f"--patch={patch}", f"--out-dir={out}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    assert manifest.provenance is not None
    assert manifest.provenance["patches"] == [{"name": "0001-tag.patch", "sha256": _sha(patch)}]
    info = kmod.modinfo((out / "modules" / "nvidia.ko").read_bytes())
    assert info["gni_patched"] == ["yes"]
    assert "gni_patched" not in (source / "nvidia.c").read_text()  # the input is untouched


def test_compile_error_names_the_first_error_and_publishes_nothing(kernel: Kernel,
                                                                   tmp_path: Path) -> None:
    source = mini_source(tmp_path / "nvidia-src")
    with (source / "nvidia-uvm.c").open("a") as handle:
        handle.write("\nstatic int broken(void) { return undeclared_thing; }\n")
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           *(f"--kernel-headers={h}" for h in assets.headers_debs(kernel)),
                           "--jobs=1", f"--out-dir={out}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "compile failed in nvidia-uvm.c line" in errors[0]
    assert "undeclared_thing" in errors[0] and "undeclared (first use" in errors[0]
    assert not out.exists()


def test_headers_given_as_a_build_directory(kernel: Kernel, tmp_path: Path) -> None:
    """`/lib/modules/<release>/build` style: the tier's extracted headers tree as is."""
    source = mini_source(tmp_path / "nvidia-src")
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           f"--kernel-headers={kernel.headers}", f"--out-dir={out}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    assert manifest.kernel_release == kernel.release
    assert manifest.provenance is not None
    assert manifest.provenance["kernel_headers"] == [
        {"name": kernel.headers.name, "version": kernel.release, "sha256": ""}]
    info = kmod.modinfo((out / "modules" / "nvidia.ko").read_bytes())
    assert info["vermagic"][0].split()[0] == kernel.release
