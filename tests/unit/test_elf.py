"""installer.node.elf: SONAME from the dynamic section, for both ELF classes and byte orders."""

from __future__ import annotations

import contextlib
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.node.elf import ElfError, is_elf, read_soname

VADDR = 0x400000


def make_elf(*, is64: bool, little: bool, soname: str | None) -> bytes:
    """A minimal shared object: header, PT_LOAD + PT_DYNAMIC, dynamic table, strtab."""
    order = "<" if little else ">"
    header_fmt = order + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH")
    phdr_fmt = order + ("IIQQQQQQ" if is64 else "IIIIIIII")
    dyn_fmt = order + ("qQ" if is64 else "iI")
    ehsize = 16 + struct.calcsize(header_fmt)
    phentsize = struct.calcsize(phdr_fmt)
    strtab = b"\0" + (soname.encode() + b"\0" if soname else b"")
    dyn_off = ehsize + 2 * phentsize
    entries = [(5, 0)] + ([(14, 1)] if soname else []) + [(0, 0)]
    dyn_size = len(entries) * struct.calcsize(dyn_fmt)
    str_off = dyn_off + dyn_size
    total = str_off + len(strtab)
    entries[0] = (5, VADDR + str_off)
    dynamic = b"".join(struct.pack(dyn_fmt, tag, value) for tag, value in entries)

    def phdr(kind: int, offset: int, size: int) -> bytes:
        if is64:
            return struct.pack(phdr_fmt, kind, 4, offset, VADDR + offset, VADDR + offset,
                               size, size, 8)
        return struct.pack(phdr_fmt, kind, offset, VADDR + offset, VADDR + offset, size,
                           size, 4, 4)

    ident = b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1]) + bytes(9)
    header = struct.pack(header_fmt, 3, 62, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 0, 0, 0)
    return (ident + header + phdr(1, 0, total) + phdr(2, dyn_off, dyn_size) + dynamic
            + strtab)


class TestReadSoname:
    @pytest.mark.parametrize("is64", [True, False])
    @pytest.mark.parametrize("little", [True, False])
    def test_both_classes_and_byte_orders(self, tmp_path: Path, is64: bool,
                                          little: bool) -> None:
        lib = tmp_path / "libfoo.so.1.2.3"
        lib.write_bytes(make_elf(is64=is64, little=little, soname="libfoo.so.1"))
        assert read_soname(lib) == "libfoo.so.1"

    def test_no_soname(self, tmp_path: Path) -> None:
        lib = tmp_path / "plain.so"
        lib.write_bytes(make_elf(is64=True, little=True, soname=None))
        assert read_soname(lib) is None

    def test_matches_readelf_on_system_libraries(self) -> None:
        libc = next(p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"),
                                Path("/lib/aarch64-linux-gnu/libc.so.6"),
                                Path("/usr/lib64/libc.so.6")) if p.exists())
        out = subprocess.run(["readelf", "-d", str(libc)], capture_output=True, text=True,
                             check=True).stdout
        assert f"[{read_soname(libc)}]" in out

    def test_an_executable_has_none(self) -> None:
        assert read_soname(Path("/bin/true")) is None

    def test_not_elf(self, tmp_path: Path) -> None:
        text = tmp_path / "script"
        text.write_text("#!/bin/sh\n")
        assert not is_elf(text)
        with pytest.raises(ElfError, match="not an ELF file"):
            read_soname(text)

    def test_truncated(self, tmp_path: Path) -> None:
        lib = tmp_path / "cut.so"
        lib.write_bytes(make_elf(is64=True, little=True, soname="libcut.so.1")[:70])
        with pytest.raises(ElfError, match="truncated"):
            read_soname(lib)

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=400), st.booleans(), st.integers(min_value=0, max_value=300))
    def test_damaged_files_raise_only_elf_error(self, tmp_path_factory: pytest.TempPathFactory,
                                                noise: bytes, is64: bool, at: int) -> None:
        data = bytearray(make_elf(is64=is64, little=True, soname="libx.so.1"))
        start = 16 + at % (len(data) - 16)
        chunk = noise[:len(data) - start]
        data[start:start + len(chunk)] = chunk
        path = tmp_path_factory.getbasetemp() / "fuzz-lib.so"
        path.write_bytes(bytes(data))
        with contextlib.suppress(ElfError):
            read_soname(path)
