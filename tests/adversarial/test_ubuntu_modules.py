"""`package build --ubuntu-modules` given hostile .debs, in the sandboxed arena.

A .deb claiming to be Canonical's linux-modules-nvidia-<branch>-server-open-<kernel> but
whose data archive climbs out (`../`), names an absolute path, or links a module out of the
archive (absolutely, or relatively out of it), or in it (a module that is a link to another
file): each is refused with exit 2 and one line naming the .deb and the member, and nothing
is written anywhere in the arena but the work dir (the CLI's TMPDIR): not the `--out-dir`,
not the sentinels `outside/`, not the node. The .debs are assembled by hand with binutils'
`ar` (dpkg-deb never writes such members); the members are tarfile's, as a hostile archive
would hold them.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from e2e import KERNEL
from ubuntudebs import MODULE_DIR, ar_deb, modules_package_name

from adversarial.harness import Arena, refused_untouched

PACKAGE = modules_package_name(KERNEL)
MODULES = f"./lib/modules/{KERNEL}/kernel/{MODULE_DIR}"
CONTROL = f"Package: {PACKAGE}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: x <x@x>\n" \
          "Description: hostile\n"


def _data_tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for member in members:
            data = b"\x7fELF evil module" if member.isfile() else None
            if data is not None:
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.mode = 0o644
    return member


def _link(name: str, target: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = tarfile.SYMTYPE, target
    return member


def _dir(name: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.mode = tarfile.DIRTYPE, 0o755
    return member


HOSTILE = {
    "climbs-out": ([_dir(MODULES), _file(f"{MODULES}/../../../../../../../escape.ko")],
                   "escape.ko"),
    "absolute": ([_file("/tmp/gni-escape.ko")], "holds no kernel modules"),  # made relative
    "link-out-absolute": ([_dir(MODULES), _link(f"{MODULES}/nvidia.ko",
                                                "/etc/sentinel.conf")], "nvidia.ko"),
    "link-out-relative": ([_dir(MODULES), _link(f"{MODULES}/nvidia.ko",
                                                "../../../../../../../outside/etc/sentinel.conf")],
                          "nvidia.ko"),
    "link-inside": ([_dir(MODULES), _file(f"{MODULES}/nvidia-uvm.ko"),
                     _link(f"{MODULES}/nvidia.ko", "nvidia-uvm.ko")], "nvidia.ko"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_modules_deb_writes_nothing(arena: Arena, case: str) -> None:
    members, named = HOSTILE[case]
    inputs = arena.base / "inputs"
    inputs.mkdir()
    deb = ar_deb(inputs, PACKAGE, _data_tar(inputs / "data.tar.xz", members), CONTROL)
    out = arena.base / "out"
    done = refused_untouched(
        arena, lambda: arena.run("package", "build", f"--ubuntu-modules={deb}",
                                 f"--out-dir={out}", timeout=30),
        2, deb.name, named, allowed=())
    assert done.stdout == ""
    assert not out.exists()
    assert not Path("/tmp/gni-escape.ko").exists()
