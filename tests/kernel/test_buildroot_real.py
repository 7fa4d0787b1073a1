"""Another distro's kernel: NVIDIA's open 550.163.01 compiled for Debian trixie's 6.12 on this
bookworm machine, by `package build --build-root auto --patch`, then loaded by that kernel.

trixie's headers need gcc-14 and kbuild tools linked against glibc 2.38, neither on the host,
so the product makes (once, cached under the test cache) a trixie root with mmdebstrap and
compiles under chroot there. Debian's 550.163.01 sources do not compile against 6.12.107+
without patches/nvidia-550.163.01-pci-resize-resource.patch (pci_resize_resource() gained a
fourth argument); without it the build fails in one line naming nv-pci.c. The package's
nvidia.ko, booted into trixie's kernel under qemu, fails with ENODEV: no GPU here, but the
kernel took the module (vermagic, symbols, relocations) and NVIDIA's code ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from nvsources import mini_source

from installer.node import kmod
from installer.packages.manifest import parse_manifest

from . import guest, trixie
from .assets import Kernel

pytestmark = pytest.mark.timeout(2400)
REPO = Path(__file__).resolve().parents[2]

LOAD_SCRIPT = r"""
set -e
for dep in $DEPS; do modprobe "$dep"; done
"$PYTHON" - <<'EOF'
import json, os, subprocess
from installer.node import syscalls
fd = os.open(os.environ["KO"], os.O_RDONLY)
try:
    syscalls.finit_module(fd, "")
    errno_ = 0
except OSError as exc:
    errno_ = exc.errno
modules = open("/proc/modules").read().split("\n")
dmesg = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
json.dump({"errno": errno_, "release": os.uname().release,
           "nvrm": [line for line in dmesg if "NVRM" in line],
           "nvidia_loaded": any(line.startswith("nvidia ") for line in modules)},
          open(os.environ["GNI_OUT"] + "/result.json", "w"))
EOF
"""


@pytest.fixture(scope="module")
def trixie_kernel() -> Kernel:
    reason = guest.qemu_unavailable_reason()
    if reason:
        pytest.skip(f"real-kernel tier needs qemu: {reason}")
    if os.geteuid() != 0:
        pytest.skip("--build-root needs root (chroot)")
    return trixie.kernel()


@pytest.fixture(scope="module")
def open_package(trixie_kernel: Kernel) -> Path:
    return trixie.build_open_package(trixie_kernel)


def test_package_identity_and_provenance(trixie_kernel: Kernel, open_package: Path) -> None:
    manifest = parse_manifest((open_package / "manifest.json").read_bytes())
    assert (manifest.kernel_release, manifest.driver_version, manifest.flavour) == (
        trixie_kernel.release, trixie.NVIDIA_VERSION, "open")
    provenance = manifest.provenance
    assert provenance is not None
    assert provenance["compiler"].startswith("x86_64-linux-gnu-gcc-14 (Debian 14.")
    assert provenance["build_root"]["distro"] == "debian"
    assert provenance["build_root"]["suite"] == "trixie"
    assert provenance["build_root"]["compiler"].startswith("gcc-14 14.")
    patch_sha = hashlib.sha256(trixie.PATCH.read_bytes()).hexdigest()
    assert provenance["patches"] == [{"name": trixie.PATCH.name, "sha256": patch_sha}]
    assert provenance["nvidia_source"]["name"] == "nvidia-open-kernel-source"


def test_modules_name_no_build_root_or_work_dir(trixie_kernel: Kernel, open_package: Path
                                                ) -> None:
    modules = sorted((open_package / "modules").glob("*.ko"))
    assert {p.name for p in modules} >= {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko",
                                         "nvidia-drm.ko"}
    for path in modules:
        info = kmod.modinfo(path.read_bytes())
        assert info["vermagic"][0].split()[0] == trixie_kernel.release, path.name
        text = subprocess.run(["strings", "-a", str(path)], capture_output=True, text=True,
                              check=True).stdout
        for leak in ("/tmp/", "gni-build", "build-roots", "/root/"):
            assert leak not in text, f"{path.name} names {leak}"


def test_trixie_kernel_loads_it_and_finds_no_gpu(trixie_kernel: Kernel, open_package: Path,
                                                 tmp_path: Path) -> None:
    ko = open_package / "modules" / "nvidia.ko"
    deps = [d for d in kmod.modinfo(ko.read_bytes()).get("depends", [""])[0].split(",") if d]
    out = tmp_path / "guest"
    out.mkdir()
    result = guest.run_in_guest(LOAD_SCRIPT, kernel=trixie_kernel, cwd=REPO, out_dir=out,
                                timeout=400.0,
                                env={"PYTHONPATH": str(REPO), "KO": str(ko),
                                     "DEPS": " ".join(deps), "PYTHON": sys.executable})
    assert result.rc == 0, result.describe()
    found = result.json("result.json")
    assert found["release"] == trixie_kernel.release
    assert found["errno"] == 19, (found, result.describe())  # ENODEV: no GPU
    assert any("No NVIDIA GPU found" in line or "NVRM" in line for line in found["nvrm"])
    assert not found["nvidia_loaded"]


def test_without_the_patch_the_compile_fails_naming_nv_pci(trixie_kernel: Kernel,
                                                           open_package: Path) -> None:
    """The real compile's outcome, kept by trixie.unpatched_build like a package (it
    compiles again whenever the sources, headers or build code change)."""
    rc, stderr, left = trixie.unpatched_build(trixie_kernel)
    errors = [line for line in stderr.splitlines() if line.startswith("error(")]
    assert rc == 2, stderr[-2000:]
    assert len(errors) == 1, stderr[-2000:]
    assert "compile failed in nvidia/nv-pci.c line" in errors[0]
    assert "pci_resize_resource" in errors[0]
    assert not left


def test_two_builds_in_different_roots_and_work_dirs_are_identical(
        trixie_kernel: Kernel, open_package: Path, tmp_path: Path) -> None:
    """A small NVIDIA-shaped source, the real trixie headers: once in the cached auto root
    with work under /tmp, once in a hard-linked copy of it elsewhere with work outside /tmp."""
    auto_root = max((p for p in trixie.build_roots().iterdir()
                     if p.name.startswith("debian-trixie-") and p.is_dir()),
                    key=lambda p: p.stat().st_mtime)  # the one open_package was built in
    copy = Path(tempfile.mkdtemp(prefix="gni-root-copy-", dir=trixie.build_roots()))
    var_tmp = Path(tempfile.mkdtemp(prefix="gni-work-", dir="/var/tmp"))
    try:
        subprocess.run(["cp", "-al", f"{auto_root}/.", str(copy)], check=True)
        headers = trixie.headers_debs(trixie_kernel)
        outs = []
        for number, (root, tmpdir) in enumerate(((auto_root, None), (copy, var_tmp))):
            source = mini_source(tmp_path.joinpath(f"place{number}", "nvidia-src"))
            out = tmp_path / f"out{number}"
            env = dict(os.environ, TMPDIR=str(tmpdir)) if tmpdir else None
            done = subprocess.run([sys.executable, "-m", "installer", "package", "build",
                                   f"--nvidia-source={source}",
                                   *(f"--kernel-headers={h}" for h in headers),
                                   f"--build-root={root}", f"--out-dir={out}"],
                                  capture_output=True, text=True, timeout=600, check=False,
                                  env=env, cwd=REPO)
            assert done.returncode == 0, done.stderr[-3000:]
            outs.append(out)
        assert (outs[0] / "manifest.json").read_bytes() == (outs[1] / "manifest.json"
                                                             ).read_bytes()
        kos = sorted(p.name for p in (outs[0] / "modules").glob("*.ko"))
        assert kos
        for name in kos:
            assert (outs[0] / "modules" / name).read_bytes() == (
                outs[1] / "modules" / name).read_bytes(), name
        assert not (copy / var_tmp.relative_to("/")).exists()  # mount points cleaned up
        assert (copy / "var" / "tmp").is_dir()  # and only those
        assert json.loads((outs[0] / "manifest.json").read_text())["provenance"][
            "build_root"]["suite"] == "trixie"
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(var_tmp, ignore_errors=True)
