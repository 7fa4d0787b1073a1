""".debs that `package build` must refuse, in the sandboxed arena: zstd as Ubuntu packs them.

Each case starts from a real .deb packed by `dpkg-deb -Zzstd` and spoils one member: an
unknown compression, damaged or truncated zstd data, a zstd data archive climbing out with
`..` or through a link, a damaged ar header. `--deb` and `--kernel-headers` both read them.
Exit 2, one line naming the member and the fix, no traceback, and nothing written in the
arena outside the work dir (the `outside` sentinels stay as they were).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from nvsources import make_deb, proprietary_source

from adversarial.harness import Arena, assert_refused, assert_untouched


def _members(deb: Path) -> list[tuple[str, bytes]]:
    """The ar members of a real .deb (name, data)."""
    data, found, at = deb.read_bytes(), [], 8
    while at < len(data):
        header = data[at:at + 60]
        size = int(header[48:58])
        found.append((header[:16].decode().strip().rstrip("/"), data[at + 60:at + 60 + size]))
        at += 60 + size + size % 2
    return found


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO(b"!<arch>\n")
    out.seek(0, io.SEEK_END)
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out.write(header.encode() + data + (b"\n" if len(data) % 2 else b""))
    return out.getvalue()


def _zstd_tar(entries: list[tarfile.TarInfo]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info in entries:
            archive.addfile(info, io.BytesIO(b"pwned\n") if info.isfile() else None)
    return zstandard.ZstdCompressor().compress(buffer.getvalue())


def _entry(name: str, *, link: str | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    if link is None:
        info.size = 6
    else:
        info.type, info.linkname = tarfile.SYMTYPE, link
    return info


def _spoiled(arena: Arena, package: str, spoil: Callable[[list[tuple[str, bytes]]], bytes]
             ) -> Path:
    """A real `dpkg-deb -Zzstd` package with `spoil` applied to its members."""
    inputs = arena.base / "inputs"
    root = inputs / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "libnvidia-ml.so.1").write_bytes(b"\x7fELF not really\n")
    deb = make_deb(root, package, "535.261.03-0ubuntu1", inputs, compression="zstd")
    members = _members(deb)
    assert [name for name, _ in members] == ["debian-binary", "control.tar.zst",
                                             "data.tar.zst"]
    deb.write_bytes(spoil(members))
    return deb


def _renamed(members: list[tuple[str, bytes]]) -> bytes:
    return _ar([(name.replace("data.tar.zst", "data.tar.lz4"), data) for name, data in members])


def _damaged(members: list[tuple[str, bytes]]) -> bytes:
    name, data = members[2]
    middle = len(data) // 2
    spoilt = data[:8] + bytes(b ^ 0x5A for b in data[8:middle]) + data[middle:]
    return _ar([*members[:2], (name, spoilt)])


def _truncated(members: list[tuple[str, bytes]]) -> bytes:
    whole = _ar(members)
    return whole[:len(whole) - len(members[2][1]) // 2]


def _climbing(members: list[tuple[str, bytes]]) -> bytes:
    return _ar([*members[:2], ("data.tar.zst", _zstd_tar([
        _entry("./usr/lib/ok.so"), _entry("../../../outside/etc/evil.conf")]))])


def _through_link(outside: Path) -> Callable[[list[tuple[str, bytes]]], bytes]:
    def spoil(members: list[tuple[str, bytes]]) -> bytes:
        return _ar([*members[:2], ("data.tar.zst", _zstd_tar([
            _entry("./usr/lib/escape", link=str(outside / "etc")),
            _entry("./usr/lib/escape/evil.conf")]))])
    return spoil


def _bad_size(members: list[tuple[str, bytes]]) -> bytes:
    whole = _ar(members)
    at = whole.index(b"data.tar.zst")
    return whole[:at + 48] + b"12x4567890" + whole[at + 58:]


CASES = {
    "unknown compression": (_renamed, ("cannot unpack data.tar.lz4", "unknown compression "
                                       "'lz4'", "fix: repack it with `dpkg-deb -Zxz`")),
    "damaged zstd": (_damaged, ("cannot unpack data.tar.zst", "not valid zstd-compressed tar",
                                "fix: download the package again")),
    "truncated zstd": (_truncated, ("cannot unpack data.tar.zst",
                                    "fix: download the package again")),
    "climbs out with ..": (_climbing, ("cannot unpack data.tar.zst", "outside the destination",
                                       "fix: use the distribution's own package")),
    "damaged ar header": (_bad_size, ("has a damaged ar header",
                                      "fix: download the package again")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_spoilt_zstd_deb_is_one_line(arena: Arena, case: str) -> None:
    spoil, causes = CASES[case]
    deb = _spoiled(arena, "libnvidia-ml1", spoil)
    before = arena.snapshot()
    done = arena.run("package", "build", f"--deb={deb}", f"--out-dir={arena.base / 'out'}",
                     timeout=5)
    assert_refused(done, 2, str(deb), *causes)
    assert "\\n" not in done.lines[0]  # tarfile's own messages span lines: never quoted
    assert done.stdout == ""
    assert_untouched(before, arena.snapshot())


def test_a_link_out_of_the_package_is_refused(arena: Arena) -> None:
    deb = _spoiled(arena, "libnvidia-ml1", _through_link(arena.outside))
    before = arena.snapshot()
    done = arena.run("package", "build", f"--deb={deb}", f"--out-dir={arena.base / 'out'}",
                     timeout=5)
    assert_refused(done, 2, "cannot unpack data.tar.zst", "is a link to an absolute path")
    assert_untouched(before, arena.snapshot())


def test_headers_with_a_link_out_leave_it_out_and_write_nothing_there(arena: Arena) -> None:
    """`--kernel-headers` leaves out links that lead outside (a headers package's `build`
    link) instead of refusing them: the file behind such a link lands inside the work dir,
    never where the link pointed; then no build tree is found."""
    deb = _spoiled(arena, "linux-headers-6.8.0-49-generic", _through_link(arena.outside))
    source = proprietary_source(arena.base / "inputs" / "nvidia-kernel")
    before = arena.snapshot()
    done = arena.run("package", "build", f"--nvidia-source={source}",
                     f"--kernel-headers={deb}", f"--out-dir={arena.base / 'out'}", timeout=5)
    assert_refused(done, 2, "--kernel-headers hold no kernel build tree")
    assert_untouched(before, arena.snapshot())
