"""The reboot fast path: reuse the last verified package when nothing relevant changed.

After a reboot the node has the same kernel and the same request, the package is still in
the host cache and the version directory is still staged: then `install` downloads and
copies nothing. Checks are cheap (sizes) unless `--paranoid` asks for a full rehash.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from installer.context import Context
from installer.installdir.layout import (
    STAGED_META,
    VERSIONS,
    cache_root,
    destination,
    version_name,
)
from installer.installdir.state import InstallState
from installer.packages.manifest import Package
from installer.packages.tree import hash_file

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo


def reusable_package(ctx: Context, node: NodeInfo, previous: InstallState | None, *,
                     paranoid: bool) -> Package | None:
    """The last verified package if it still fits this node and is intact, else None."""
    config = ctx.config
    if previous is None or not previous.matches(
            kernel_release=node.kernel_release, requested_version=config.driver_version,
            flavour_requested=config.flavour):
        return None
    package = cached(ctx, previous.package_digest, verify=paranoid)
    if package is None:
        ctx.log.info("fast path unavailable", reason="package no longer intact in the cache")
        return None
    if not staged_intact(ctx, package, paranoid=paranoid):
        ctx.log.info("fast path restages", reason="staged files differ from the manifest")
    sweep_cache(ctx)
    return package


def cached(ctx: Context, digest: str, *, verify: bool) -> Package | None:
    """A package the host cache holds whole (rehashed when `verify`), without any network."""
    from installer.packages.cache import Cache, cached_package

    return cached_package(Cache(cache_root(ctx.config, ctx.host.roots)), digest, verify=verify)


def sweep_cache(ctx: Context) -> None:
    """Clear what interrupted runs left in the cache's temp area: the fast path opens no
    download run, whose start would otherwise do it."""
    from installer.packages.cache import Cache

    Cache(cache_root(ctx.config, ctx.host.roots)).sweep()


def staged_intact(ctx: Context, package: Package, *, paranoid: bool) -> bool:
    """Whether the staged version directory still has every file at its size (and hash).

    When it does not, its metadata is removed so that the stage's `prepare_version` rebuilds
    it.
    """
    version_dir = ctx.install_root / VERSIONS / version_name(package.manifest)
    for entry in package.manifest.files:
        path = version_dir / destination(entry)
        if not _file_ok(path, entry.size, entry.sha256 if paranoid else None):
            (version_dir / STAGED_META).unlink(missing_ok=True)
            return False
    return True


def _file_ok(path: Path, size: int, sha256: str | None) -> bool:
    try:
        if path.stat().st_size != size:
            return False
    except OSError:
        return False
    return sha256 is None or hash_file(path, size) == (size, sha256)
