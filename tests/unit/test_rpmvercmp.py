"""rpm's version ordering, checked against rpm's own test suite and the installed rpm.

PAIRS are every active case of `tests/rpmvercmp.at` in rpm-software-management/rpm at
commit 0920d3339b706049d26e8cc18d8bf966616c2f32 (`RPMVERCMP(a, b, result)`; the cases it
comments out as documented oddities are left out too). The caret (`^`) cases it lacks are
asked of the real rpm (`rpm --eval '%{lua: print(rpm.vercmp(a, b))}'`) where it is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from installer.packages.builder.dnfheaders import RpmEntry, choose
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.rpmvercmp import evr_compare, rpmvercmp

PAIRS = [
    ("1.0", "1.0", 0), ("1.0", "2.0", -1), ("2.0", "1.0", 1),
    ("2.0.1", "2.0.1", 0), ("2.0", "2.0.1", -1), ("2.0.1", "2.0", 1),
    ("2.0.1a", "2.0.1a", 0), ("2.0.1a", "2.0.1", 1), ("2.0.1", "2.0.1a", -1),
    ("5.5p1", "5.5p1", 0), ("5.5p1", "5.5p2", -1), ("5.5p2", "5.5p1", 1),
    ("5.5p10", "5.5p10", 0), ("5.5p1", "5.5p10", -1), ("5.5p10", "5.5p1", 1),
    ("10xyz", "10.1xyz", -1), ("10.1xyz", "10xyz", 1),
    ("xyz10", "xyz10", 0), ("xyz10", "xyz10.1", -1), ("xyz10.1", "xyz10", 1),
    ("xyz.4", "xyz.4", 0), ("xyz.4", "8", -1), ("8", "xyz.4", 1), ("xyz.4", "2", -1),
    ("2", "xyz.4", 1),
    ("5.5p2", "5.6p1", -1), ("5.6p1", "5.5p2", 1),
    ("5.6p1", "6.5p1", -1), ("6.5p1", "5.6p1", 1),
    ("6.0.rc1", "6.0", 1), ("6.0", "6.0.rc1", -1),
    ("10b2", "10a1", 1), ("10a2", "10b2", -1),
    ("1.0aa", "1.0aa", 0), ("1.0a", "1.0aa", -1), ("1.0aa", "1.0a", 1),
    ("10.0001", "10.0001", 0), ("10.0001", "10.1", 0), ("10.1", "10.0001", 0),
    ("10.0001", "10.0039", -1), ("10.0039", "10.0001", 1),
    ("4.999.9", "5.0", -1), ("5.0", "4.999.9", 1),
    ("20101121", "20101121", 0), ("20101121", "20101122", -1), ("20101122", "20101121", 1),
    ("2_0", "2_0", 0), ("2.0", "2_0", 0), ("2_0", "2.0", 0),
    ("a", "a", 0), ("a+", "a+", 0), ("a+", "a_", 0), ("a_", "a+", 0), ("+a", "+a", 0),
    ("+a", "_a", 0), ("_a", "+a", 0), ("+_", "+_", 0), ("_+", "+_", 0), ("_+", "_+", 0),
    ("+", "_", 0), ("_", "+", 0),
    ("1.0~rc1", "1.0~rc1", 0), ("1.0~rc1", "1.0", -1), ("1.0", "1.0~rc1", 1),
    ("1.0~rc1", "1.0~rc2", -1), ("1.0~rc2", "1.0~rc1", 1),
    ("1.0~rc1~git123", "1.0~rc1~git123", 0), ("1.0~rc1~git123", "1.0~rc1", -1),
    ("1.0~rc1", "1.0~rc1~git123", 1),
]
CARETS = ["1.0^", "1.0^git1", "1.0^git2", "1.0", "1.01", "1.0~rc1^git1", "1.0~rc1",
          "1.0^git1~pre", "1.1", "427.13.1.el9_4", "427.el9", "70.el9", "5.14.0"]


@pytest.mark.parametrize(("left", "right", "expected"), PAIRS)
def test_rpms_own_cases(left: str, right: str, expected: int) -> None:
    assert rpmvercmp(left, right) == expected


@pytest.mark.skipif(shutil.which("rpm") is None, reason="needs rpm (make deps)")
def test_carets_and_kernels_as_the_installed_rpm_orders_them() -> None:
    pairs = [(a, b) for a in CARETS for b in CARETS]
    script = "".join(f'print(rpm.vercmp("{a}", "{b}") .. " ") ' for a, b in pairs)
    done = subprocess.run(["rpm", "--eval", f"%{{lua: {script}}}"], capture_output=True,
                          text=True, check=True, timeout=60)
    theirs = [int(line) for line in done.stdout.split()]
    assert [rpmvercmp(a, b) for a, b in pairs] == theirs


def test_epoch_then_version_then_release() -> None:
    assert evr_compare(("1", "1.0", "1"), ("", "9.0", "9")) == 1
    assert evr_compare(("0", "5.14.0", "427.el9"), ("", "5.14.0", "70.el9")) == 1
    assert evr_compare(("", "5.14.0", "70.el9"), ("0", "5.14.0", "70.el9")) == 0


def _entry(version: str, release: str, arch: str = "x86_64", epoch: str = "0") -> RpmEntry:
    return RpmEntry("kernel-devel", arch, (epoch, version, release),
                    f"http://m/Packages/kernel-devel-{version}-{release}.{arch}.rpm",
                    1, "sha256", "0" * 64)


def test_the_highest_match_of_the_arch_wins() -> None:
    entries = [_entry("5.14.0", "70.el9"), _entry("5.14.0", "427.el9"),
               _entry("5.14.0", "503.el9", "aarch64"), _entry("5.15.0", "1.el9")]
    assert choose("kernel-devel", "5.14.0", entries, "x86_64").evr[2] == "427.el9"
    assert choose("kernel-devel", None, entries, "x86_64").evr[1] == "5.15.0"
    exact = choose("kernel-devel", "5.14.0-70.el9.x86_64", entries, "x86_64")
    assert exact.evr[2] == "70.el9"
    with pytest.raises(PackageBuildError, match=re.escape("kernel-devel-5.14.0-503.el9 for")):
        choose("kernel-devel", "5.14.0-503.el9", entries, "x86_64")
