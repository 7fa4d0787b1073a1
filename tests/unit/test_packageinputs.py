"""Module load order and the .deb reader of `package build` (installer/packageinputs.py)."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.packages.builder.inputs import (
    ModuleInfo,
    PackageBuildError,
    deb_control,
    extract_deb,
    load_order,
)


def _module(name: str, depends: tuple[str, ...]) -> ModuleInfo:
    return ModuleInfo(name, Path(f"{name}.ko"), depends, "6.1.0-26-cloud-amd64", None, None)


@st.composite
def dags(draw: st.DrawFn) -> list[ModuleInfo]:
    """Modules where each may depend on earlier ones and on host modules (e.g. drm)."""
    count = draw(st.integers(min_value=1, max_value=8))
    names = [f"mod{i}" for i in range(count)]
    modules = []
    for i, name in enumerate(names):
        inner = draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        host = draw(st.lists(st.sampled_from(["drm", "drm_kms_helper", "video"]), unique=True))
        modules.append(_module(name, tuple(inner + host)))
    return modules


class TestLoadOrder:
    """Dependencies first, whatever order the directory listed the modules in."""

    @given(dags(), st.randoms(use_true_random=False))
    def test_dependencies_come_first_and_order_is_stable(
            self, modules: list[ModuleInfo], rng: random.Random) -> None:
        shuffled = modules[:]
        rng.shuffle(shuffled)
        order = load_order(shuffled)
        assert sorted(m.name for m in order) == sorted(m.name for m in modules)
        seen: set[str] = set()
        names = {m.name for m in modules}
        for module in order:
            assert all(dep in seen for dep in module.depends if dep in names)
            seen.add(module.name)
        assert [m.name for m in load_order(modules)] == [m.name for m in order]

    def test_nvidia_order_among_ready_modules(self) -> None:
        modules = [_module("nvidia_drm", ("nvidia", "nvidia_modeset", "drm")),
                   _module("nvidia_modeset", ("nvidia",)), _module("nvidia_uvm", ("nvidia",)),
                   _module("nvidia", ("drm",)), _module("nvidia_peermem", ("nvidia",))]
        assert [m.name for m in load_order(modules)] == [
            "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]

    def test_cycle_is_refused(self) -> None:
        with pytest.raises(PackageBuildError, match="cycle"):
            load_order([_module("a", ("b",)), _module("b", ("a",))])


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out.write(header.encode() + data + (b"\n" if len(data) % 2 else b""))
    return out.getvalue()


def _tar(entries: list[tarfile.TarInfo], payload: bytes = b"x") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info in entries:
            archive.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    return buffer.getvalue()


def _compressed(suffix: str, entries: list[tarfile.TarInfo], payload: bytes = b"x") -> bytes:
    """A tar archive compressed as a .deb member named `data.tar<suffix>` would be."""
    import bz2
    import lzma

    import zstandard

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info in entries:
            archive.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    plain = buffer.getvalue()
    return {"": lambda: plain, ".gz": lambda: _tar(entries, payload),
            ".xz": lambda: lzma.compress(plain),
            ".lzma": lambda: lzma.compress(plain, format=lzma.FORMAT_ALONE),
            ".bz2": lambda: bz2.compress(plain),
            ".zst": lambda: zstandard.ZstdCompressor().compress(plain)}[suffix]()


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


class TestDebReader:
    """A .deb is an ar archive; its data.tar is unpacked with tarfile's `data` filter."""

    def test_unpacks_data_tar(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"), ("control.tar.gz", _tar([])),
                             ("data.tar.gz", _tar([_file("./usr/lib/libx.so.1")]))]))
        extract_deb(deb, tmp_path / "out")
        assert (tmp_path / "out/usr/lib/libx.so.1").read_bytes() == b"x"

    @pytest.mark.parametrize("suffix", ["", ".gz", ".xz", ".lzma", ".bz2", ".zst"])
    def test_every_compression_dpkg_reads(self, tmp_path: Path, suffix: str) -> None:
        control = _file("./control")
        text = b"Package: libx1\nVersion: 1.0-1\nArchitecture: arm64\n"
        control.size = len(text)
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"),
                             (f"control.tar{suffix}", _compressed(suffix, [control], text)),
                             (f"data.tar{suffix}",
                              _compressed(suffix, [_file("./usr/lib/libx.so.1")]))]))
        extract_deb(deb, tmp_path / "out")
        assert (tmp_path / "out/usr/lib/libx.so.1").read_bytes() == b"x"
        assert deb_control(deb) == {"Package": "libx1", "Version": "1.0-1",
                                    "Architecture": "arm64"}

    @pytest.mark.parametrize(("member", "data", "expected"), [
        ("data.tar.lz4", b"\x04\x22\x4d\x18", "cannot unpack data.tar.lz4: unknown "
         "compression 'lz4' (dpkg writes gzip, xz, zstd, bzip2, lzma or none)"),
        ("data.tar.zst", b"\x28\xb5\x2f\xfd garbage", "cannot unpack data.tar.zst: not valid "
         "zstd-compressed tar data"),
        ("data.tar.xz", b"\xfd7zXZ\x00 garbage", "cannot unpack data.tar.xz: not valid "
         "xz-compressed tar data"),
        ("data.tar.gz", b"not gzip at all", "cannot unpack data.tar.gz: not valid "
         "gzip-compressed tar data"),
    ])
    def test_unknown_or_damaged_member_is_one_line(self, tmp_path: Path, member: str,
                                                   data: bytes, expected: str) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"), (member, data)]))
        with pytest.raises(PackageBuildError) as caught:
            extract_deb(deb, tmp_path / "out")
        line = caught.value.one_line()
        assert expected in line and "\\n" not in line and "\n" not in line, line
        assert caught.value.code == 2

    def test_a_gzip_member_failing_its_crc_is_refused(self, tmp_path: Path) -> None:
        """The deflate data decodes, but its CRC (the stream's last bytes) says it changed:
        the member is read to its end so that the check runs."""
        data = bytearray(_tar([_file("./usr/lib/libx.so.1")]))
        data[-8] ^= 0xFF  # the CRC32 of the trailer
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("data.tar.gz", bytes(data))]))
        with pytest.raises(PackageBuildError, match="not valid gzip-compressed tar data "
                                                    r"\(CRC check failed"):
            extract_deb(deb, tmp_path / "out")

    def test_a_huge_control_file_is_refused(self, tmp_path: Path) -> None:
        control = _file("./control")
        control.size = 2 * 1024 * 1024
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("control.tar.gz", _tar([control], b"A" * control.size))]))
        with pytest.raises(PackageBuildError, match="control file is over 1048576 bytes"):
            deb_control(deb)

    @pytest.mark.parametrize("entry", [_file("../escape"), _link("usr/evil", "/etc/shadow"),
                                       _link("usr/up", "../../../etc/shadow")])
    def test_unsafe_members_are_refused(self, tmp_path: Path, entry: tarfile.TarInfo) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"), ("data.tar.gz", _tar([entry]))]))
        with pytest.raises(PackageBuildError, match="cannot unpack"):
            extract_deb(deb, tmp_path / "out")
        assert not (tmp_path / "escape").exists()

    def test_absolute_names_stay_inside_the_target(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("data.tar.gz", _tar([_file("/gni-test-absolute")]))]))
        extract_deb(deb, tmp_path / "out")
        assert (tmp_path / "out" / "gni-test-absolute").is_file()
        assert not Path("/gni-test-absolute").exists()

    def test_damaged_header_and_missing_data_are_refused(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(b"!<arch>\nshort")
        with pytest.raises(PackageBuildError, match="damaged ar header"):
            extract_deb(deb, tmp_path / "out")
        deb.write_bytes(_ar([("debian-binary", b"2.0\n")]))
        with pytest.raises(PackageBuildError, match=r"no data\.tar"):
            extract_deb(deb, tmp_path / "out")
        whole = _ar([("data.tar.gz", _tar([_file("./x")]))])
        deb.write_bytes(whole[:56] + b"1x" + whole[58:])  # a size that is no number
        with pytest.raises(PackageBuildError, match="damaged ar header"):
            extract_deb(deb, tmp_path / "out")
