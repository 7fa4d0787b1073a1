"""NVIDIA's kernel-module sources for `package build --nvidia-source`, unpacked and identified.

Accepted: Debian's `nvidia-kernel-source` / `nvidia-open-kernel-source` `.deb` (a
`usr/src/nvidia*.tar.xz` inside), NVIDIA's `.run` (its `kernel/` and `kernel-open/` trees),
a tarball of either tree, or a directory (an extracted `.run`, or one module tree). A module
tree is a directory with NVIDIA's `Kbuild` (it names the version, `NV_VERSION_STRING`) and
`Makefile`; it is proprietary when it declares the NVIDIA licence (`nvidia/nv-frontend.c`,
or `nvidia/nv.c` from 550 on).
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from installer.packages.builder.inputs import (
    PackageBuildError,
    deb_control,
    extract_deb,
    extract_run,
    file_sha256,
)

_VERSION_RE = re.compile(r'NV_VERSION_STRING=\\?"(\d{3,4}\.\d{1,3}(?:\.\d{1,3})?)\\?"')
_MAX_DEPTH = 4


@dataclass(frozen=True)
class NvSource:
    """Unpacked sources: one module tree per flavour, their version, where they came from."""

    trees: dict[str, Path]
    version: str
    name: str
    package_version: str
    sha256: str

    def tree(self, flavour: str | None) -> tuple[str, Path]:
        """The flavour asked for (or the only one there is) and its module tree."""
        if flavour is None:
            if len(self.trees) != 1:
                raise PackageBuildError(
                    f"{self.name} has both open and proprietary modules",
                    remedy="pass --flavour open or --flavour proprietary")
            flavour = next(iter(self.trees))
        if flavour not in self.trees:
            raise PackageBuildError(
                f"{self.name} has no {flavour} modules (it has "
                f"{', '.join(sorted(self.trees))})",
                remedy="open modules need kernel-open/ (a .run of 515 or newer, or Debian's "
                       "nvidia-open-kernel-source); pass the --flavour the sources have")
        return flavour, self.trees[flavour]


def tree_sha256(root: Path) -> str:
    """A digest of a directory's files (names and bytes, sorted), for provenance."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def unpack_source(path: Path, work: Path) -> NvSource:
    """Unpack `path` under `work` and find its module trees and version."""
    if not path.exists():
        raise PackageBuildError(f"--nvidia-source {path} does not exist")
    name, package_version = path.name, ""
    if path.is_dir():
        root, sha = path, tree_sha256(path)
    else:
        sha, root = file_sha256(path), work / "nvsource"
        head = path.open("rb").read(16384)
        if head.startswith(b"!<arch>\n"):
            control = deb_control(path)
            name = control.get("Package", path.name)
            package_version = control.get("Version", "")
            extract_deb(path, work / "nvdeb")
            tarballs = sorted((work / "nvdeb" / "usr" / "src").glob("nvidia*.tar*"))
            if not tarballs:
                raise PackageBuildError(f"{path} holds no usr/src/nvidia*.tar.* source tarball",
                                        remedy="pass nvidia-kernel-source or "
                                               "nvidia-open-kernel-source")
            _untar(tarballs[0], root, str(path))
        elif head.startswith(b"#!"):
            extract_run(path, root)
        else:
            _untar(path, root, str(path))
    trees = _find_trees(root, name)
    versions = {_version(tree) for tree in trees.values()}
    if len(versions) != 1:
        raise PackageBuildError(f"{path}: its module trees disagree on the version "
                                f"({', '.join(sorted(versions))})")
    return NvSource(trees, versions.pop(), name, package_version, sha)


def _untar(tarball: Path, dest: Path, where: str) -> None:
    try:
        with tarfile.open(tarball, mode="r:*") as archive:
            archive.extractall(dest, filter="data")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise PackageBuildError(f"{where}: cannot unpack the NVIDIA sources ({exc})",
                                remedy="check the file is complete (download it again)"
                                ) from None


def _is_tree(path: Path) -> bool:
    kbuild = path / "Kbuild"
    return kbuild.is_file() and (path / "Makefile").is_file() and (
        b"NV_VERSION_STRING" in kbuild.read_bytes())


def _find_trees(root: Path, name: str) -> dict[str, Path]:
    """`kernel/` and `kernel-open/` of a .run, else the one module tree (flavour by licence)."""
    found: dict[str, Path] = {}
    candidates = [root, *sorted(p for depth in range(1, _MAX_DEPTH)
                                for p in root.glob("/".join(["*"] * depth)) if p.is_dir())]
    for tree in (c for c in candidates if _is_tree(c)):
        flavour = ("open" if tree.name == "kernel-open" else
                   "proprietary" if tree.name == "kernel" else _licence_flavour(tree))
        found.setdefault(flavour, tree)
    if not found:
        raise PackageBuildError(f"{name}: no NVIDIA kernel-module sources found (NVIDIA's Kbuild "
                                "and Makefile)",
                                remedy="pass nvidia-kernel-source .deb, an NVIDIA .run, or "
                                       "its extracted kernel/ or kernel-open/ directory")
    return found


def _licence_flavour(tree: Path) -> str:
    """Proprietary when the tree declares NVIDIA's licence (in `nv-frontend.c` up to 535,
    in `nv.c` from 550 on); Debian's open tree also carries an `nv-kernel.o_binary`."""
    for name in ("nv-frontend.c", "nv.c"):
        source = tree / "nvidia" / name
        if source.is_file() and 'MODULE_LICENSE("NVIDIA")' in source.read_text(errors="replace"):
            return "proprietary"
    return "open"


def _version(tree: Path) -> str:
    match = _VERSION_RE.search((tree / "Kbuild").read_text(errors="replace"))
    if not match:
        raise PackageBuildError(f"{tree / 'Kbuild'} does not say its version "
                                "(NV_VERSION_STRING)")
    return match[1]
