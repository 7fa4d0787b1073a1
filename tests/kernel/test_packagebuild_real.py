"""`package build` over NVIDIA's real 535 modules (built for Debian's kernel) and user-mode files.

No guest is booted: this reads the real `.ko` files' `.modinfo` and checks the package's
module list against the real kernel's `modules.dep`, so every dependency the package does
not carry itself is a module that kernel really has.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import artifacts
from click.testing import CliRunner

from installer.cli import cli
from installer.packages.manifest import parse_manifest

from .assets import Kernel

VERSION = "535.261.03"


def _host_module_names(kernel: Kernel) -> set[str]:
    names = set()
    for line in (kernel.modules_dir / "modules.dep").read_text().splitlines():
        path = line.split(":", 1)[0]
        name = Path(path).name.split(".ko", 1)[0]
        names.add(name.replace("-", "_"))
    return names


def test_real_modules_package(tmp_path: Path, kernel: Kernel, nvidia_real: Path) -> None:
    out = tmp_path / "pkg"
    result = CliRunner().invoke(cli, ["package", "build", f"--modules={nvidia_real}",
                                      f"--tree={artifacts.nvidia_tree(VERSION)}",
                                      f"--out-dir={out}"])
    assert result.exit_code == 0, result.stderr
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    assert (manifest.kernel_release, manifest.driver_version, manifest.flavour) == (
        kernel.release, VERSION, "proprietary")
    names = [module.name for module in manifest.modules]
    assert names == ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
    outside = {dep for module in manifest.modules for dep in module.depends} - set(names)
    assert outside and outside <= _host_module_names(kernel)
    for module in manifest.modules:
        entry = manifest.file(module.file)
        real = nvidia_real / Path(module.file).name
        assert entry.sha256 == hashlib.sha256(real.read_bytes()).hexdigest()
