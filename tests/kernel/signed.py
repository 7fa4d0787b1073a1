"""Packages whose modules `package build` signed, for the real-kernel tier.

- `product`: the 535 test modules signed by the product with a throw-away RSA key (made by
  the real openssl): the kernel must parse the signature and reject it for its key;
- `vendor`: a module of Debian's own kernel (signed by Debian's build key, which that kernel
  trusts), split into the unsigned module and its detached tail, then re-joined by
  `package build --signatures`: the kernel must load it under enforcement.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from signing_keys import make_key

from installer.cli import cli
from installer.packages.build.modsig import strip_signature

from .assets import Kernel

VENDOR_MODULE = "kernel/lib/crc-itu-t.ko"  # no dependencies, loads without hardware


def package_build(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["package", "build", *args])
    assert result.exit_code == 0, result.stderr


def product_signed(test_modules: Path, work: Path) -> Path:
    pair = make_key(work / "keys", "throwaway")
    out = work / "product"
    package_build([f"--modules={test_modules}", f"--out-dir={out}", f"--sign-key={pair.key}",
                   f"--sign-cert={pair.cert}"])
    return out


def vendor_attached(kernel: Kernel, work: Path) -> tuple[Path, Path]:
    """(package, Debian's original signed module file)."""
    original = kernel.modules_dir / VENDOR_MODULE
    unsigned, tail = strip_signature(original.read_bytes())
    assert tail, f"{original} is not signed"
    (work / "vendor-in").mkdir(parents=True)
    (work / "vendor-sigs").mkdir()
    (work / "vendor-in" / original.name).write_bytes(unsigned)
    (work / "vendor-sigs" / f"{original.name}.sig").write_bytes(tail)
    out = work / "vendor"
    package_build([f"--modules={work / 'vendor-in'}", f"--signatures={work / 'vendor-sigs'}",
                   "--driver-version=535.261.03", "--flavour=proprietary", f"--out-dir={out}"])
    return out, original
