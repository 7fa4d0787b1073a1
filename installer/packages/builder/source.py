"""Source packages: user-mode files plus NVIDIA's kernel-module sources, for no kernel yet.

`package build --nvidia-source SRC` with user-mode inputs and no `--kernel-headers` makes one.
It is an ordinary package (same manifest, same checks, same cache) whose `kernel_release`
is `source` and whose module sources are files of kind `source` under `kernel-source/`;
a node whose kernel has no package builds its modules from it (`BUILD_FALLBACK=auto`).
In a repository it sits at `source/<driver>/<flavour>/` and index.json lists it like any
package (kernel `source`), so older readers parse the index and simply never match it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.packages.builder.inputs import PackageBuildError, Picked, pick_user_files
from installer.packages.builder.nvsource import unpack_source
from installer.packages.builder.publish import Identity, update_index, write_package, write_tarball
from installer.packages.manifest import (
    DRIVER_VERSION_RE,
    SOURCE_RELEASE,
    Manifest,
    Package,
    sha256_hex,
)

if TYPE_CHECKING:
    from installer.packages.builder import BuildRequest

SOURCE_DIR = "kernel-source"


def source_files(tree: Path) -> list[Picked]:
    """Every file of one NVIDIA module tree, as package files of kind `source`."""
    picked = []
    for path in sorted(tree.rglob("*")):
        if path.is_symlink():
            raise PackageBuildError(f"the NVIDIA sources hold a symbolic link ({path.name})",
                                    remedy="give sources without links (an extracted .run or "
                                           "Debian's nvidia-kernel-source)")
        if path.is_file():
            picked.append(Picked(f"{SOURCE_DIR}/{path.relative_to(tree).as_posix()}", path,
                                 "source"))
    return picked


def build_source(request: BuildRequest, user_trees: Callable[[Any, Path], list[Path]],
                 destination_of: Callable[[Any, Identity], Path]
                 ) -> tuple[Manifest, str, Path, Path | None, Path | None, dict[str, str]]:
    """Write a source package for a checked request without --kernel-headers (the caller's
    `user_trees` unpacks the user-mode inputs, `destination_of` says where it goes)."""
    with tempfile.TemporaryDirectory(prefix="gni-source-") as work:
        source = unpack_source(request.nvidia_source or Path(), Path(work) / "nv")
        flavour, tree = source.tree(request.flavour)
        picked, links = pick_user_files(user_trees(request, Path(work)), request.arch)
        if not any(p.kind == "library" for p in picked):
            raise PackageBuildError("a source package needs the user-mode files too",
                                    remedy="also give --deb, --run or --tree")
        tails = {p.relpath.rsplit(".so.", 1)[1] for p in picked if ".so." in p.relpath}
        others = sorted(t for t in tails if DRIVER_VERSION_RE.match(t) and t != source.version)
        if others or (request.driver_version not in (None, source.version)):
            raise PackageBuildError(
                f"the NVIDIA sources are version {source.version} but the user-mode files or "
                f"--driver-version say {', '.join(others or [str(request.driver_version)])}",
                remedy="give sources and user-mode files of one version")
        identity = Identity(source.version, SOURCE_RELEASE, flavour)
        destination = destination_of(request, identity)
        provenance = {"nvidia_source": {"name": source.name, "version": source.package_version
                                        or source.version, "sha256": source.sha256},
                      "kernel_headers": [], "compiler": "", "patches": []}
        manifest, data = write_package(destination, identity, request.arch, request.os,
                                       picked + source_files(tree), links, [], [], (),
                                       provenance, repo=request.repo)
    digest = sha256_hex(data)
    tarball = write_tarball(destination, request.tarball) if request.tarball else None
    index, aliases = (update_index(request.repo, manifest, digest, request.aliases)
                      if request.repo else (None, {}))
    return manifest, digest, destination, tarball, index, aliases


def is_source(manifest: Manifest) -> bool:
    """A source package (modules still to be built), not one for a kernel."""
    return manifest.kernel_release == SOURCE_RELEASE


def source_tree(source: Package, dest: Path) -> Path:
    """A source package's module sources laid out as a tree in `dest`, copied from its
    verified files (the node's on-node builds compile from it: modules, nvidia-peermem)."""
    for entry in source.manifest.files:
        if entry.kind != "source":
            continue
        target = dest / entry.path.removeprefix(f"{SOURCE_DIR}/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.path_of(entry.path), target)
        target.chmod(0o755 if target.suffix == ".sh" else 0o644)
    return dest
