"""The one ELF reader, in pure Python: a library's SONAME, a module's section, the machine.

Staging names each library's `SONAME` link (`libcuda.so.1 -> libcuda.so.535.261.03`) from
what the dynamic linker will look for, never from a guess on the file name. Only the ELF
header, the program headers and the few bytes of the dynamic section and string table are
read, so a 29 MB `libcuda.so` costs a handful of small reads. Kernel modules are
relocatable objects: their `.modinfo` is found through the section headers instead.

pyelftools answers the same questions but adds its import time to the load path and
parses whole header tables; these three questions take about a hundred lines here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_MAGIC = b"\x7fELF"
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_MAX_DYNAMIC = 1 << 20
_MAX_NAME = 4096


class ElfError(ValueError):
    """The file is not an ELF object this reader understands."""


@dataclass(frozen=True)
class _Layout:
    """Field formats for one ELF class and byte order."""

    order: str
    is64: bool

    @property
    def header(self) -> str:
        # e_type .. e_shstrndx after the 16-byte e_ident
        return self.order + ("HHIQQQIHHHHHH" if self.is64 else "HHIIIIIHHHHHH")

    @property
    def phdr(self) -> str:
        return self.order + ("IIQQQQQQ" if self.is64 else "IIIIIIII")

    @property
    def dyn(self) -> str:
        return self.order + ("qQ" if self.is64 else "iI")

    @property
    def shdr(self) -> str:
        # sh_name sh_type sh_flags sh_addr sh_offset sh_size ...
        return self.order + ("IIQQQQ" if self.is64 else "IIIIII")


@dataclass(frozen=True)
class _Segment:
    kind: int
    offset: int
    vaddr: int
    filesz: int


def _layout(ident: bytes) -> _Layout:
    if len(ident) < 16 or ident[:4] != _MAGIC:
        raise ElfError("not an ELF file")
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ElfError(f"unknown ELF class {ident[4]} or byte order {ident[5]}")
    return _Layout("<" if ident[5] == 1 else ">", ident[4] == 2)


def _seek(handle: BinaryIO, offset: int) -> None:
    """Offsets come from the file itself: an absurd one is damage, not a crash."""
    try:
        handle.seek(offset)
    except (ValueError, OverflowError, OSError) as exc:
        raise ElfError(f"offset {offset:#x} is outside the file") from exc


def _read_at(handle: BinaryIO, offset: int, size: int) -> bytes:
    _seek(handle, offset)
    data = handle.read(size)
    if len(data) != size:
        raise ElfError(f"truncated ELF file (wanted {size} bytes at {offset})")
    return data


def _segments(handle: BinaryIO, layout: _Layout) -> list[_Segment]:
    header = struct.unpack(layout.header, _read_at(handle, 16, struct.calcsize(layout.header)))
    phoff, phentsize, phnum = header[4], header[8], header[9]
    if phnum > 4096 or phentsize < struct.calcsize(layout.phdr):
        raise ElfError("implausible program header table")
    table = _read_at(handle, phoff, phentsize * phnum)
    segments = []
    for index in range(phnum):
        raw = table[index * phentsize: index * phentsize + struct.calcsize(layout.phdr)]
        fields = struct.unpack(layout.phdr, raw)
        if layout.is64:  # p_type p_flags p_offset p_vaddr p_paddr p_filesz ...
            segments.append(_Segment(fields[0], fields[2], fields[3], fields[5]))
        else:  # p_type p_offset p_vaddr p_paddr p_filesz ...
            segments.append(_Segment(fields[0], fields[1], fields[2], fields[4]))
    return segments


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    """Dynamic entries hold virtual addresses; the PT_LOAD that maps one gives its offset."""
    for segment in segments:
        if segment.kind == _PT_LOAD and segment.vaddr <= vaddr < segment.vaddr + segment.filesz:
            return segment.offset + (vaddr - segment.vaddr)
    raise ElfError(f"address {vaddr:#x} is in no loadable segment")


def _dynamic_entries(handle: BinaryIO, layout: _Layout, dynamic: _Segment) -> dict[int, int]:
    size = min(dynamic.filesz, _MAX_DYNAMIC)
    data = _read_at(handle, dynamic.offset, size)
    entries: dict[int, int] = {}
    for tag, value in struct.iter_unpack(layout.dyn, data[: size - size % struct.calcsize(
            layout.dyn)]):
        if tag == _DT_NULL:
            break
        entries.setdefault(tag, value)
    return entries


def _string_at(handle: BinaryIO, offset: int) -> str:
    _seek(handle, offset)
    data = handle.read(_MAX_NAME)
    end = data.find(b"\0")
    if end < 0:
        raise ElfError("unterminated string in the dynamic string table")
    try:
        return data[:end].decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise ElfError("SONAME is not valid UTF-8") from exc


def read_soname(path: Path) -> str | None:
    """The DT_SONAME of an ELF shared object, or None when it declares none.

    Raises ElfError when the file is not an ELF object (or is damaged).
    """
    with path.open("rb") as handle:
        layout = _layout(handle.read(16))
        segments = _segments(handle, layout)
        dynamic = next((s for s in segments if s.kind == _PT_DYNAMIC), None)
        if dynamic is None:
            return None
        entries = _dynamic_entries(handle, layout, dynamic)
        if _DT_SONAME not in entries or _DT_STRTAB not in entries:
            return None
        strtab = _file_offset(segments, entries[_DT_STRTAB])
        return _string_at(handle, strtab + entries[_DT_SONAME])


def is_elf(path: Path) -> bool:
    """True when the file starts with the ELF magic."""
    try:
        with path.open("rb") as handle:
            return handle.read(4) == _MAGIC
    except OSError:
        return False


MACHINES = {62: "x86_64", 183: "aarch64"}


def machine(head: bytes) -> str | None:
    """x86_64 or aarch64 from an ELF header's e_machine (first 20 bytes); None otherwise."""
    try:
        layout = _layout(head[:16])
    except ElfError:
        return None
    if len(head) < 20:
        return None
    number: int = struct.unpack_from(layout.order + "H", head, 18)[0]
    return MACHINES.get(number)


@dataclass(frozen=True)
class Section:
    """One section header of an object held in memory: where its bytes are."""

    index: int
    name: bytes
    kind: int
    offset: int
    size: int
    link: int
    entsize: int


_SHDR64, _SHDR32 = "IIQQQQIIQQ", "IIIIIIIIII"  # sh_name .. sh_entsize


def sections(data: bytes) -> tuple[_Layout, list[Section]]:
    """Every section header of an ELF object in memory, each checked to lie in the data.

    Raises ElfError when the object is damaged (a header or a section outside the data).
    """
    layout = _layout(data[:16])
    if len(data) < 16 + struct.calcsize(layout.header):
        raise ElfError("truncated ELF header")
    header = struct.unpack_from(layout.header, data, 16)
    shoff, shentsize, shnum, shstrndx = header[5], header[10], header[11], header[12]
    fmt = layout.order + (_SHDR64 if layout.is64 else _SHDR32)
    if (shoff == 0 or shstrndx >= shnum or shentsize < struct.calcsize(fmt)
            or shoff + shnum * shentsize > len(data)):
        raise ElfError("ELF section table missing or truncated")
    raw = [struct.unpack_from(fmt, data, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = raw[shstrndx][4], raw[shstrndx][5]
    names = data[names_off:names_off + names_size]
    found = []
    for index, fields in enumerate(raw):
        name_end = names.find(b"\0", fields[0])
        kind, offset, size = fields[1], fields[4], fields[5]
        if kind != _SHT_NOBITS and offset + size > len(data):
            raise ElfError(f"section {index} lies outside the file")
        found.append(Section(index, names[fields[0]:name_end] if name_end >= 0 else b"",
                             kind, offset, size, fields[6], fields[9]))
    return layout, found


_SHT_NOBITS = 8
_SHN_ABS = 0xFFF1


@dataclass(frozen=True)
class Symbol:
    """A `.symtab` entry: its name, value and the section it is defined in."""

    name: bytes
    value: int
    shndx: int

    @property
    def absolute(self) -> bool:
        return self.shndx == _SHN_ABS


def symbols(data: bytes, prefix: bytes = b"") -> list[Symbol]:
    """The `.symtab` entries whose names start with `prefix` (a relocatable `.ko` keeps its
    symbol table: modules are only --strip-debug'ed)."""
    layout, table = sections(data)
    symtab = next((s for s in table if s.name == b".symtab"), None)
    if symtab is None or symtab.link >= len(table):
        return []
    strtab = table[symtab.link]
    strings = data[strtab.offset:strtab.offset + strtab.size]
    fmt = layout.order + ("IBBHQQ" if layout.is64 else "IIIBBH")
    size = struct.calcsize(fmt)
    found = []
    for start in range(symtab.offset, symtab.offset + symtab.size - size + 1, size):
        fields = struct.unpack_from(fmt, data, start)
        name_off = fields[0]
        value, shndx = (fields[4], fields[3]) if layout.is64 else (fields[1], fields[5])
        if not strings.startswith(prefix, name_off):
            continue
        end = strings.find(b"\0", name_off)
        found.append(Symbol(strings[name_off:end if end >= 0 else len(strings)], value,
                            shndx))
    return found


def section(data: bytes, wanted: bytes) -> bytes:
    """One section's bytes from an ELF object held in memory (a `.ko` file's `.modinfo`).

    Raises ElfError when the object is damaged or has no such section.
    """
    layout = _layout(data[:16])
    if len(data) < 16 + struct.calcsize(layout.header):
        raise ElfError("truncated ELF header")
    header = struct.unpack_from(layout.header, data, 16)
    shoff, shentsize, shnum, shstrndx = header[5], header[10], header[11], header[12]
    if shoff == 0 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ElfError("ELF section table missing or truncated")

    def entry(index: int) -> tuple[int, int, int]:
        fields = struct.unpack_from(layout.shdr, data, shoff + index * shentsize)
        return fields[0], fields[4], fields[5]  # name offset, file offset, size

    _, str_off, str_size = entry(shstrndx)
    names = data[str_off:str_off + str_size]
    for index in range(shnum):
        name_off, offset, size = entry(index)
        if names[name_off:names.find(b"\0", name_off)] == wanted:
            return data[offset:offset + size]
    raise ElfError(f"no {wanted.decode()} section")
