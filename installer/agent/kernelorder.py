"""Which of two kernel releases is newer: dpkg's version ordering, applied to `uname -r`.

Debian and Ubuntu name a kernel's release after its package's version (`6.1.0-58-amd64`,
`6.12.117+deb13-amd64`, `6.8.0-51-generic`) and order packages with dpkg's `verrevcmp`
(dpkg lib/dpkg/version.c): runs of digits compare as numbers, the other runs character by
character with letters before other characters and `~` before everything, even the end.
That ordering is what `apt` upgraded to, so it is the one that says which installed kernel
came after the running one; COS' `6.6.56+` orders the same way. Two releases that compare
equal are the same kernel.
"""

from __future__ import annotations

import functools


def _order(char: str) -> int:
    """dpkg's `order()`: `~` lowest, then the end of the string, digits, letters, the rest."""
    if char == "~":
        return -1
    if char.isdigit():
        return 0
    if not char:
        return 0
    if char.isascii() and char.isalpha():
        return ord(char)
    return ord(char) + 256


def compare(a: str, b: str) -> int:
    """<0, 0 or >0 as release `a` is older than, the same as or newer than `b`."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def newer(a: str, b: str) -> bool:
    """Whether release `a` came after release `b`."""
    return compare(a, b) > 0


def newest(releases: list[str]) -> str | None:
    """The newest of `releases` (None for none)."""
    ordered = sorted(releases, key=functools.cmp_to_key(compare))
    return ordered[-1] if ordered else None
