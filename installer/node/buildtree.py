"""The node's kernel build tree (`/lib/modules/<release>/build`), made usable from here.

On the node the tree is `/usr/src/linux-headers-<release>` and Debian's Makefile includes
`/usr/src/linux-headers-<...>-common/Makefile` by absolute path; its `scripts` link into
`linux-kbuild-X.Y`. Seen from the container those absolute names would mean the container's
own `/usr/src`, so the (small) arch tree is copied into our work area with every link
re-pointed at its target resolved under the host root, and the include rewritten to the
`-common` tree under the host root. The big `-common` tree is only read, in place.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path, PurePosixPath

from installer.errors import PackageNotFoundError
from installer.node.host import Roots

_INCLUDE_RE = re.compile(r"^include\s+(/\S+)/Makefile\s*$", re.M)
_CC_RE = re.compile(r'^CONFIG_CC_VERSION_TEXT="([^"]*)"', re.M)


class NoBuildTreeError(PackageNotFoundError):
    """The node has no usable build tree for its kernel (exit 5: install its headers)."""


def node_build_dir(release: str) -> PurePosixPath:
    return PurePosixPath("/lib/modules") / release / "build"


def find_build_tree(roots: Roots, release: str) -> Path:
    """The node's build tree for `release`, resolved under the host root, or a refusal."""
    where = node_build_dir(release)
    try:
        tree = roots.node(where)
    except (OSError, ValueError):
        tree = None
    if tree is None or not ((tree / ".config").is_file() and (
            tree / "include" / "generated" / "utsrelease.h").is_file()):
        raise NoBuildTreeError(
            f"no kernel build tree for {release} on the node ({where} is missing or "
            "incomplete), so no package can be built here",
            remedy=f"install linux-headers-{release} on the node (apt-get install "
                   f"linux-headers-{release}), or publish a package for this kernel")
    return tree


def kernel_compiler(tree: Path) -> tuple[str, str]:
    """The compiler command the kernel was built with (`gcc-12`) and its version text."""
    match = _CC_RE.search((tree / ".config").read_text(errors="replace"))
    text = match[1] if match else ""
    return (text.split()[0] if text else "gcc"), text


def copy_build_tree(roots: Roots, tree: Path, dest: Path) -> Path:
    """Copy the arch tree to `dest`, links and the -common include re-rooted at the host."""
    node_tree = PurePosixPath("/") / tree.relative_to(roots.host).as_posix()
    shutil.copytree(tree, dest, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if entry.is_symlink():
                relative = entry.relative_to(dest).as_posix()
                target = roots.node(node_tree / relative)
                entry.unlink()
                entry.symlink_to(target)
    makefile = dest / "Makefile"
    text = makefile.read_text(errors="replace") if makefile.is_file() else ""
    include = _INCLUDE_RE.search(text)
    if include and len(text) <= 4096:
        common = roots.node(include[1])
        makefile.unlink()
        makefile.write_text(text.replace(f"include {include[1]}/", f"include {common}/"))
    return dest
