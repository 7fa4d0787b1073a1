"""Kernel symbol versions (CONFIG_MODVERSIONS): what a module recorded, what an exporter has.

A module built with modversions carries, per symbol it imports, the CRC its build saw: the
`__versions` section, an array of `struct modversion_info { unsigned long crc; char
name[64 - sizeof(unsigned long)]; }` (include/linux/module.h; Debian's linux-headers-6.1.0-57-
common). The kernel compares each with the exporter's CRC at load and refuses a module that
"disagrees about version of symbol" (kernel/module/version.c, check_version()). An exporting
module keeps its CRCs in `__kcrctab`/`__kcrctab_gpl`, each labelled by a local `__crc_<sym>`
symbol (SYMBOL_CRC in include/linux/export-internal.h, 6.1 and later); older kernels made
`__crc_<sym>` an absolute symbol whose value is the CRC. A kernel build's `Module.symvers`
lists the same as `0xCRC<TAB>symbol<TAB>module<TAB>export type<TAB>namespace` lines.

Every input here may be hostile (a doctored package, a node file): sizes are bounded, and a
malformed table raises ModversionsError naming what is wrong, never an IndexError.
"""

from __future__ import annotations

import struct

from installer.node import elf

MODULE_NAME_LEN_64 = 56  # 64 - sizeof(unsigned long) on a 64-bit kernel
MAX_ENTRIES = 65536  # a real module imports a few hundred symbols; ib_core exports ~700
MAX_SYMVERS_LINES = 200_000  # a distribution kernel's Module.symvers has ~30 000
CRC_PREFIX = b"__crc_"
CRC_SECTIONS = (b"__kcrctab", b"__kcrctab_gpl")


class ModversionsError(ValueError):
    """A symbol-version table that is not what the kernel writes."""


def recorded(data: bytes) -> dict[str, int]:
    """The module's `__versions`: symbol -> the CRC its build recorded.

    An object without the section records nothing (a kernel without modversions).
    """
    try:
        layout, table = elf.sections(data)
    except elf.ElfError as exc:
        raise ModversionsError(f"not a kernel module: {exc}") from None
    found = next((s for s in table if s.name == b"__versions"), None)
    if found is None:
        return {}
    word = 8 if layout.is64 else 4
    size = 64
    if found.size % size:
        raise ModversionsError(f"__versions is {found.size} bytes, not a whole number of "
                               f"{size}-byte entries")
    if found.size // size > MAX_ENTRIES:
        raise ModversionsError(f"__versions has {found.size // size} entries (at most "
                               f"{MAX_ENTRIES})")
    body = data[found.offset:found.offset + found.size]
    crcs: dict[str, int] = {}
    for start in range(0, len(body), size):
        crc = struct.unpack_from(layout.order + ("Q" if word == 8 else "I"), body, start)[0]
        raw = body[start + word:start + size]
        end = raw.find(b"\0")
        if end <= 0:
            raise ModversionsError(f"__versions entry {start // size} has no symbol name")
        name = raw[:end]
        if not _is_symbol(name):
            raise ModversionsError(f"__versions entry {start // size} is not a symbol name")
        crcs[name.decode()] = crc & 0xFFFFFFFF
    return crcs


def exported(data: bytes) -> dict[str, int]:
    """An exporting module's own CRCs: symbol -> CRC, from its `__crc_<sym>` symbols."""
    try:
        _, table = elf.sections(data)
        symbols = elf.symbols(data, CRC_PREFIX)
    except elf.ElfError as exc:
        raise ModversionsError(f"not a kernel module: {exc}") from None
    if len(symbols) > MAX_ENTRIES:
        raise ModversionsError(f"{len(symbols)} __crc_ symbols (at most {MAX_ENTRIES})")
    crcs: dict[str, int] = {}
    for symbol in symbols:
        name = symbol.name[len(CRC_PREFIX):]
        if not _is_symbol(name):
            continue
        if symbol.absolute:
            crcs[name.decode()] = symbol.value & 0xFFFFFFFF
            continue
        if symbol.shndx >= len(table) or table[symbol.shndx].name not in CRC_SECTIONS:
            continue
        where = table[symbol.shndx]
        if symbol.value + 4 > where.size:
            raise ModversionsError(f"__crc_{name.decode()} points outside {where.name.decode()}")
        crcs[name.decode()] = struct.unpack_from("<I" if data[5] == 1 else ">I", data,
                                                 where.offset + symbol.value)[0]
    return crcs


def parse_symvers(text: str, module: str) -> dict[str, int]:
    """The CRCs `Module.symvers` lists for one exporting module (`.../ib_core` or
    `ib_core`): `0xCRC<TAB>symbol<TAB>module<TAB>export type[<TAB>namespace]` lines."""
    crcs: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if number > MAX_SYMVERS_LINES:
            raise ModversionsError(f"more than {MAX_SYMVERS_LINES} lines")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 4 or not fields[0].startswith("0x"):
            raise ModversionsError(f"line {number} is not '0xCRC<TAB>symbol<TAB>module"
                                   f"<TAB>type': {line[:60]!r}")
        try:
            crc = int(fields[0], 16)
        except ValueError:
            raise ModversionsError(f"line {number}: {fields[0][:20]!r} is not a CRC") from None
        if crc > 0xFFFFFFFF or not _is_symbol(fields[1].encode()):
            raise ModversionsError(f"line {number}: not a 32-bit CRC and a symbol name")
        if fields[2] == module or fields[2].endswith("/" + module):
            crcs[fields[1]] = crc
    return crcs


def symvers_text(crcs: dict[str, int], module: str) -> str:
    """`Module.symvers` lines for one module's exports (what `parse_symvers` reads back):
    modpost takes them from KBUILD_EXTRA_SYMBOLS to resolve and version a module's imports
    when the exporter is not built in the same tree."""
    return "".join(f"{crc:#010x}\t{name}\t{module}\tEXPORT_SYMBOL\t\n"
                   for name, crc in sorted(crcs.items()))


def _is_symbol(name: bytes) -> bool:
    """A C identifier (what modpost writes), at most the name field's length."""
    return (0 < len(name) <= MODULE_NAME_LEN_64 + 8
            and all(c == 0x5F or c == 0x2E or 0x30 <= c <= 0x39 or 0x41 <= c <= 0x5A
                    or 0x61 <= c <= 0x7A for c in name))


def mismatches(imported: dict[str, int], exports: dict[str, int]
               ) -> list[tuple[str, int, int]]:
    """(symbol, the module's recorded CRC, the exporter's) for each disagreement."""
    return sorted((name, crc, exports[name]) for name, crc in imported.items()
                  if name in exports and exports[name] != crc)
