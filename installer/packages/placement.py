"""Where a package's files land when staged, and which packages would collide there.

Libraries, binaries and modules are flattened to `lib64/<basename>`, `bin/<basename>`,
`drivers/<basename>`; firmware keeps its path below `firmware/` (a source package's
module sources, never staged themselves, keep theirs below `src/`). Two entries that land on
one staged path would overwrite each other at staging (and, through a hard link, the
verified cache blob of the first), so validation refuses such a manifest outright, and also
names equal under case folding in one directory (a case-insensitive filesystem merges them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Protocol

from installer.errors import IntegrityError

KIND_DIRS = {"library": "lib64", "binary": "bin", "module": "drivers", "firmware": "firmware",
             "config": "etc", "source": "src"}


class Placed(Protocol):
    """A manifest file entry: where it lands depends on its path and kind."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...


class Linked(Protocol):
    """A manifest link entry: a name beside the file it points at."""

    @property
    def path(self) -> str: ...
    @property
    def target(self) -> str: ...


def destination(entry: Placed) -> PurePosixPath:
    """Where a manifest file lands inside a version directory, by its kind."""
    if entry.kind not in KIND_DIRS:
        raise IntegrityError(f"manifest file {entry.path} has unknown kind {entry.kind!r}")
    path = PurePosixPath(entry.path)
    if path.is_absolute() or ".." in path.parts:
        raise IntegrityError(f"manifest path {entry.path} escapes the package")
    if entry.kind == "firmware" and "firmware" in path.parts[:-1]:
        index = len(path.parts) - 1 - path.parts[::-1].index("firmware")
        return PurePosixPath("firmware", *path.parts[index + 1:])
    if entry.kind == "source":  # a source package's module tree keeps its shape (never staged)
        return PurePosixPath(KIND_DIRS["source"], path)
    return PurePosixPath(KIND_DIRS[entry.kind], path.name)


def link_destination(link: Linked, target: Placed) -> PurePosixPath:
    """A link is staged beside the staged file it points at, under its own basename."""
    return destination(target).parent / PurePosixPath(link.path).name


def _fold(path: PurePosixPath) -> str:
    return str(path.parent / path.name.casefold())


def staged_clash(files: Sequence[Placed], links: Sequence[Linked]) -> str | None:
    """Why two entries would land on one staged path (or a file on a directory), or None.

    Links must already point at files of the package in their own directory.
    """
    by_path = {entry.path: entry for entry in files}
    placed = [(f"files[{i}] {entry.path!r}", destination(entry))
              for i, entry in enumerate(files)]
    placed += [(f"links[{i}] {link.path!r}", link_destination(
        link, by_path[str(PurePosixPath(link.path).parent / link.target)]))
        for i, link in enumerate(links)]
    seen: dict[str, tuple[str, PurePosixPath]] = {}
    for label, staged in placed:
        first = seen.setdefault(_fold(staged), (label, staged))
        if first[0] != label:
            how = "" if first[1] == staged else " (names equal ignoring case)"
            return f"{first[0]} and {label} would both be staged at {staged}{how}"
    dirs = {_fold(parent): parent for _, staged in placed for parent in staged.parents}
    for label, staged in placed:
        if _fold(staged) in dirs:
            return f"{label} would be staged at {staged}, which another file needs as a directory"
    return None
