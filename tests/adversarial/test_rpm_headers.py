"""Hostile `kernel-devel` RPMs given to `package build --kernel-headers`, in the sandboxed arena.

Each RPM is made by the real `rpmbuild`. The traversal case is one whose payload (left
uncompressed) and header name a directory of 60 characters that is then overwritten, in
both, by `../` twenty times: what a forged package would carry, and what `rpm2archive`
passes on unchanged. Every case must end in exit 2 with one line naming the cause, and
nothing created, changed or deleted in the arena outside its work directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nvsources import fake_kbuild, mini_source
from rpmrepos import build_rpm, rpm_tools

from adversarial.harness import Arena, assert_refused, assert_untouched

pytestmark = pytest.mark.skipif(not rpm_tools(), reason="needs rpmbuild and rpm2archive: "
                                "make deps")
RELEASE = "5.14.0-427.el9.x86_64"
PLACEHOLDER = "A" * 60
ESCAPE = "../" * 20


def _refused_build(arena: Arena, rpm: Path, *causes: str) -> None:
    source = mini_source(arena.base / "inputs" / "nvidia-kernel")
    before = arena.snapshot()
    done = arena.run("package", "build", f"--nvidia-source={source}",
                     f"--kernel-headers={rpm}", f"--out-dir={arena.base / 'out'}")
    assert_refused(done, 2, *causes)
    assert "Traceback" not in done.stderr
    assert_untouched(before, arena.snapshot())


def _kernel_tree(base: Path, release: str = RELEASE) -> Path:
    fake_kbuild(base / "usr" / "src" / "kernels" / release, release)
    return base


def test_a_member_climbing_out_of_the_work_area(arena: Arena, tmp_path: Path) -> None:
    tree = _kernel_tree(tmp_path / "tree")
    (tree / "usr" / "src" / "kernels" / PLACEHOLDER).mkdir()
    (tree / "usr" / "src" / "kernels" / PLACEHOLDER / "planted").write_text("escaped\n")
    rpm = build_rpm(tree, tmp_path, version="5.14.0", release="427.el9", payload="w.ufdio")
    data = rpm.read_bytes()
    assert data.count(PLACEHOLDER.encode()) >= 2  # the header's name and the payload's
    forged = arena.base / "inputs" / rpm.name
    forged.parent.mkdir(parents=True)
    forged.write_bytes(data.replace(PLACEHOLDER.encode(), ESCAPE.encode()))
    _refused_build(arena, forged, f"{forged}: cannot unpack its payload",
                   "is outside the destination")


def test_links_pointing_out_are_left_out(arena: Arena, tmp_path: Path) -> None:
    """`scripts` as an absolute link to the arena's outside/, `include/config` as a relative
    one climbing out: both are dropped, so the tree lacks scripts/ and is refused as such."""
    tree = _kernel_tree(tmp_path / "tree")
    kernel = tree / "usr" / "src" / "kernels" / RELEASE
    (kernel / "scripts").rmdir()
    (kernel / "scripts").symlink_to(arena.outside / "etc")
    (kernel / "include" / "config").symlink_to(ESCAPE + str(arena.outside).lstrip("/"))
    rpm = build_rpm(tree, tmp_path, version="5.14.0", release="427.el9")
    _refused_build(arena, rpm, f"kernel headers {RELEASE}: scripts/ is missing")


def test_a_package_naming_another_release(arena: Arena, tmp_path: Path) -> None:
    tree = _kernel_tree(tmp_path / "tree", "5.14.0-1.el9.x86_64")
    rpm = build_rpm(tree, tmp_path, version="5.14.0", release="427.el9")
    _refused_build(arena, rpm, f"claim release {RELEASE} but were built for "
                   "5.14.0-1.el9.x86_64")


def test_a_cut_short_rpm(arena: Arena, tmp_path: Path) -> None:
    rpm = build_rpm(_kernel_tree(tmp_path / "tree"), tmp_path, version="5.14.0",
                    release="427.el9")
    cut = arena.base / "inputs" / rpm.name
    cut.parent.mkdir(parents=True)
    cut.write_bytes(rpm.read_bytes()[:200])
    _refused_build(arena, cut, f"{cut}: the RPM header is cut short")
