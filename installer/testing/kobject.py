"""Tiny kernel-module-shaped ELF64 objects for tests: `.modinfo`, and the symbol versions.

What a real `.ko` holds for modversions (Debian's linux-headers-6.1.0-57-common):
`__versions`, an array of `struct modversion_info { unsigned long crc; char name[56]; }`
(include/linux/module.h), for the symbols the module imports; and, for those it exports,
`__kcrctab` with one u32 CRC per symbol, each labelled by a local `__crc_<sym>` symbol in
`.symtab` (SYMBOL_CRC in include/linux/export-internal.h). Real modules of Debian's 6.1 and
6.12 kernels have exactly this shape (`readelf -S -s ib_core.ko`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

_SHDR = "<IIQQQQIIQQ"
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB, _SHT_NOTE = 1, 2, 3, 7
_SHF_ALLOC = 2


def module_object(modinfo: Sequence[str], *, versions: Mapping[str, int] | None = None,
                  exports: Mapping[str, int] | None = None,
                  build_id: bytes | None = None) -> bytes:
    """An ELF64 x86_64 relocatable object: `.modinfo`, and `__versions` (imports -> CRC),
    `__kcrctab` + `__crc_<sym>` symbols (exports -> CRC) and a `.note.gnu.build-id` section
    (these bytes, as the kernel shows them in /sys/module/<name>/notes) when given."""
    sections: list[tuple[str, int, int, bytes, int, int, int]] = []  # name type flags data
    if build_id is not None:
        sections.append((".note.gnu.build-id", _SHT_NOTE, _SHF_ALLOC, build_id, 0, 0, 0))
    sections.append((".modinfo", _SHT_PROGBITS, _SHF_ALLOC,            # link info entsize
                     b"".join(f.encode() + b"\0" for f in modinfo), 0, 0, 0))
    if versions is not None:
        body = b"".join(struct.pack("<Q", crc) + name.encode().ljust(56, b"\0")[:56]
                        for name, crc in versions.items())
        sections.append(("__versions", _SHT_PROGBITS, _SHF_ALLOC, body, 0, 0, 0))
    if exports:
        crctab_index = len(sections) + 1
        sections.append(("__kcrctab", _SHT_PROGBITS, _SHF_ALLOC,
                         b"".join(struct.pack("<I", crc) for crc in exports.values()),
                         0, 0, 0))
        strtab = b"\0"
        symtab = b"\0" * 24
        for i, name in enumerate(exports):
            symtab += struct.pack("<IBBHQQ", len(strtab), 0, 0, crctab_index, 4 * i, 0)
            strtab += f"__crc_{name}".encode() + b"\0"
        strtab_index = len(sections) + 2
        sections.append((".symtab", _SHT_SYMTAB, 0, symtab, strtab_index,
                         1 + len(exports), 24))
        sections.append((".strtab", _SHT_STRTAB, 0, strtab, 0, 0, 0))
    return _assemble(sections)


def _assemble(sections: list[tuple[str, int, int, bytes, int, int, int]]) -> bytes:
    names = b"\0"
    offsets = []
    body = b""
    for name, *_rest in sections:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    headers = [struct.pack(_SHDR, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for (_, kind, flags, data, link, info, entsize), name_off in zip(sections, offsets,
                                                                       strict=True):
        headers.append(struct.pack(_SHDR, name_off, kind, flags, 0, 64 + len(body),
                                   len(data), link, info, 1, entsize))
        body += data
    headers.append(struct.pack(_SHDR, shstr_name, _SHT_STRTAB, 0, 0, 64 + len(body),
                               len(names), 0, 0, 1, 0))
    body += names
    shoff = 64 + len(body)
    count = len(headers)
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
              + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, count,
                            count - 1))
    return header + body + b"".join(headers)
