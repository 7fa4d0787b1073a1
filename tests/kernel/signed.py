"""Packages whose modules `package build` signed, for the real-kernel tier.

- `product`: the 535 test modules signed by the product with a throw-away RSA key (made by
  the real openssl): the kernel must parse the signature and reject it for its key;
- `vendor`: a module of Debian's own kernel (signed by Debian's build key, which that kernel
  trusts), split into the unsigned module and its detached tail, then re-joined by
  `package build --signatures`: the kernel must load it under enforcement.

`enforced_loads` boots once with `module.sig_enforce=1` and offers files to the raw
`finit_module` (scenarios.py's `raw_loads`); `assert_rejected_for_key` and
`assert_rejected_as_unsigned` read what the kernel answered for one of them.
"""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from signing_keys import make_key

from installer.cli import cli
from installer.packages.builder.modsig import strip_signature

from . import guest
from .assets import Kernel
from .conftest import REPO

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


def enforced_loads(kernel: Kernel, out: Path, cases: list[tuple[str, str]]) -> dict[str, Any]:
    """One boot with module.sig_enforce=1: each (case, file under `out`) through the raw
    finit_module, in order; the guest's results (`cases` by name, `sig_enforce`, `cmdline`)."""
    (out / "args.json").write_text(json.dumps({"cases": cases}))
    script = (f'"{sys.executable}" tests/kernel/scenarios.py raw_loads "$GNI_OUT/args.json" '
              f'"$GNI_OUT/results.json"\n')
    result = guest.run_in_guest(script, kernel=kernel, cmdline="module.sig_enforce=1",
                                timeout=600, cwd=REPO, env={"PYTHONPATH": str(REPO)},
                                out_dir=out)
    assert result.rc == 0, result.describe()
    data: dict[str, Any] = result.json("results.json")
    return data


def assert_rejected_for_key(case: dict[str, Any]) -> None:
    """The kernel parsed the appended signature and refused it for its (unknown) key."""
    assert case["errno"] == errno.EKEYREJECTED == 129, case
    assert case["strerror"] == "Key was rejected by service"
    text = "\n".join(case["dmesg"])
    assert "Loading of module with unavailable key is rejected" in text, case
    assert "unsigned" not in text, case  # the kernel found the appended signature
    assert not {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"} & set(case["modules"])


def assert_rejected_as_unsigned(case: dict[str, Any]) -> None:
    assert case["errno"] == 129, case
    assert any("Loading of unsigned module is rejected" in line for line in case["dmesg"]), case
    assert not any("unavailable key" in line for line in case["dmesg"]), case


MODULES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko")


class EnforcedBootChecks:
    """What one `enforced_loads` boot must show, for a test module whose `enforced` fixture
    offered MODULES, then "unsigned" (the same module unsigned) and "garbled" (its DER's
    first tag broken): subclass it as `Test...` beside that fixture."""

    def test_guest_enforces_signatures(self, enforced: dict[str, Any]) -> None:
        assert enforced["sig_enforce"] == "Y"
        assert "module.sig_enforce=1" in enforced["cmdline"]

    @pytest.mark.parametrize("name", MODULES)
    def test_kernel_parses_the_signature_and_rejects_the_key(
            self, enforced: dict[str, Any], name: str) -> None:
        assert_rejected_for_key(enforced["cases"][name])

    def test_the_same_module_unsigned_is_rejected_as_unsigned(
            self, enforced: dict[str, Any]) -> None:
        assert_rejected_as_unsigned(enforced["cases"]["unsigned"])

    def test_a_garbled_signature_is_a_bad_message(self, enforced: dict[str, Any]) -> None:
        """The kernel really parses the DER: break its first tag and it says EBADMSG, not
        "unavailable key", so the signatures' structure is what it parsed."""
        case = enforced["cases"]["garbled"]
        assert case["errno"] == errno.EBADMSG, case
        assert not any("unavailable key" in line for line in case["dmesg"]), case
