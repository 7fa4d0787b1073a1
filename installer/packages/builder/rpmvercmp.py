"""rpm's version ordering (`rpmvercmp`, and epoch:version-release compared as dnf does).

Which `kernel-devel` of a dnf repository is the highest must be decided the way rpm decides
it, not as strings: `5.14.0-427.el9` > `5.14.0-70.el9`. The rules follow rpm's
`rpmio/rpmvercmp.c`: the strings are split into runs of digits and runs of letters (every
other character only separates); `~` sorts before anything, even the end, and `^` after the
end but before anything else; a numeric run beats an alphabetic one; numbers compare
without leading zeros; the longer string wins when one is a prefix of the other.
"""

from __future__ import annotations

import re

_SEGMENT_RE = re.compile(r"[A-Za-z0-9~^]")


def rpmvercmp(left: str, right: str) -> int:
    """-1, 0 or 1 as `left` is older than, equal to or newer than `right` (rpm's rules)."""
    if left == right:
        return 0
    one, two = left, right
    while one or two:
        one, two = _skip_separators(one), _skip_separators(two)
        for mark, before in (("~", -1), ("^", None)):
            if one.startswith(mark) or two.startswith(mark):
                decided = _marked(one, two, mark, before)
                if decided is not None:
                    return decided
                one, two = one[1:], two[1:]
                break
        else:
            if not (one and two):
                break
            numeric = one[0].isdigit()
            pattern = r"[0-9]+" if numeric else r"[A-Za-z]+"
            first, second = re.match(pattern, one), re.match(pattern, two)
            if second is None:  # a numeric run beats an alphabetic one
                return 1 if numeric else -1
            assert first is not None
            decided = _compare_runs(first[0], second[0], numeric)
            if decided:
                return decided
            one, two = one[first.end():], two[second.end():]
    if not one and not two:
        return 0
    return -1 if not one else 1  # what is left over makes the string newer


def _skip_separators(text: str) -> str:
    found = _SEGMENT_RE.search(text)
    return text[found.start():] if found else ""


def _marked(one: str, two: str, mark: str, before: int | None) -> int | None:
    """`~` (before: -1) sorts first; `^` sorts after the end of the other string but before
    anything else; None when both carry the mark (compare what follows)."""
    if one.startswith(mark) and two.startswith(mark):
        return None
    if before is not None:  # tilde
        return -1 if one.startswith(mark) else 1
    if one.startswith(mark):  # caret on the left
        return 1 if not two else -1
    return -1 if not one else 1


def _compare_runs(first: str, second: str, numeric: bool) -> int:
    if numeric:
        first, second = first.lstrip("0"), second.lstrip("0")
        if len(first) != len(second):
            return 1 if len(first) > len(second) else -1
    return (first > second) - (first < second)


def evr_compare(left: tuple[str, str, str], right: tuple[str, str, str]) -> int:
    """(epoch, version, release) compared as rpm's `rpmVersionCompare`: epoch (empty is 0)
    as a number, then version, then release with `rpmvercmp`."""
    epochs = (int(left[0] or 0), int(right[0] or 0))
    if epochs[0] != epochs[1]:
        return 1 if epochs[0] > epochs[1] else -1
    return rpmvercmp(left[1], right[1]) or rpmvercmp(left[2], right[2])
