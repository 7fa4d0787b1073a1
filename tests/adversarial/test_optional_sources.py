"""`package build --gdrcopy` / `--nvidia-fs` given hostile source tarballs, in the sandboxed arena.

A tarball that climbs out (`../`), links out of itself (absolutely or relatively), or is
not the project's layout at all: each is refused with exit 2 and one line naming the flag,
the tarball and the cause, before anything compiles, and nothing is written anywhere in
the arena but the work dir (the CLI's TMPDIR): not the `--out-dir`, not the sentinels
`outside/`, not the node. The NVIDIA sources are the stand-in tree (tests/nvsources.py) and
the headers a tree that is only good enough to be read (nothing compiles).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from nvsources import fake_headers, mini_source

from adversarial.harness import Arena, refused_untouched

RELEASE = "6.1.0-57-amd64"


def _member(name: str, *, link: str | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    member = tarfile.TarInfo(name)
    if link is not None:
        member.type, member.linkname = tarfile.SYMTYPE, link
        return member, None
    data = b"/* hostile */\n"
    member.mode, member.size = 0o644, len(data)
    return member, data


HOSTILE = {
    "climbs-out": ([_member("gdrcopy/src/gdrdrv/gdrdrv.c"),
                    _member("gdrcopy/../../../../../../escape.c")], "cannot unpack it"),
    "link-out-absolute": ([_member("gdrcopy/src/gdrdrv/Makefile", link="/etc/passwd")],
                          "cannot unpack it"),
    "link-out-relative": ([_member("gdrcopy/src/gdrdrv/Makefile",
                                   link="../../../../../../../outside/etc/sentinel.conf")],
                          "cannot unpack it"),
    "not-gdrcopy": ([_member("something/src/main.c")], "is not GDRCopy's source tree"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gdrcopy_tarball_writes_nothing(arena: Arena, case: str) -> None:
    members, cause = HOSTILE[case]
    inputs = arena.base / "inputs"
    inputs.mkdir()
    tarball = inputs / f"gdrcopy-{case}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    source = mini_source(inputs / "nvidia")
    headers = fake_headers(inputs / f"linux-headers-{RELEASE}", RELEASE)
    out = arena.base / "out"
    done = refused_untouched(
        arena, lambda: arena.run("package", "build", f"--nvidia-source={source}",
                                 f"--kernel-headers={headers}", f"--gdrcopy={tarball}",
                                 f"--out-dir={out}", timeout=5),
        2, "--gdrcopy", tarball.name, cause, allowed=())
    assert done.stdout == ""
    assert not out.exists()
    assert not Path("/escape.c").exists()


def test_nvidia_fs_with_proprietary_sources_writes_nothing(arena: Arena) -> None:
    inputs = arena.base / "inputs"
    source = mini_source(inputs / "nvidia")
    headers = fake_headers(inputs / f"linux-headers-{RELEASE}", RELEASE)
    (inputs / "nvfs" / "src").mkdir(parents=True)
    out = arena.base / "out"
    refused_untouched(
        arena, lambda: arena.run("package", "build", f"--nvidia-source={source}",
                                 f"--kernel-headers={headers}", "--flavour=proprietary",
                                 f"--nvidia-fs={inputs / 'nvfs'}", f"--out-dir={out}",
                                 timeout=5),
        2, "--nvidia-fs needs NVIDIA's open kernel modules", allowed=())
    assert not out.exists()
