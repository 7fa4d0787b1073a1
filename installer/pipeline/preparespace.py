"""What `prepare` checks before it writes (room in the cache) and what it tells an operator
when no source has the package (the `package build` command that would make it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from installer.context import Context
from installer.errors import DiskFullError, free_bytes
from installer.installdir.layout import cache_root
from installer.installdir.state import read_state
from installer.packages.manifest import DRIVER_VERSION_RE, ManifestError, parse_manifest
from installer.packages.repository import flavour_order

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo

# Room assumed for a package when the cache holds none to measure: a data-centre driver's
# package (modules, user-mode libraries, firmware) is 300-700 MB.
DEFAULT_PACKAGE_BYTES = 1 << 30


def space_needed(ctx: Context, node: NodeInfo) -> int:
    """Bytes a new package for `node`'s kernel may take in the cache: 0 when it already
    holds one for that kernel and arch, else the largest package it holds (one driver's
    packages for two kernels are about as large; their shared files are stored once, so
    this errs high), else DEFAULT_PACKAGE_BYTES."""
    from installer.packages.cache import Cache

    cache = Cache(cache_root(ctx.config, ctx.host.roots))
    refs = cache.refs()
    if any(r.kernel_release == node.kernel_release and r.arch == node.kernel_arch
           for r in refs):
        return 0
    sizes = []
    for ref in refs:
        data = cache.manifest_data(ref.digest)
        try:
            manifest = parse_manifest(data, source=str(cache.root)) if data else None
        except ManifestError:
            manifest = None
        if manifest is not None:
            sizes.append(sum(entry.size for entry in manifest.files))
    return max(sizes) if sizes else DEFAULT_PACKAGE_BYTES


def check_space(ctx: Context, node: NodeInfo) -> int:
    """DiskFullError (exit 11) before anything is written when the cache's filesystem has
    less room than `space_needed`; returns the bytes checked for."""
    root = cache_root(ctx.config, ctx.host.roots)
    needed = space_needed(ctx, node)
    free = free_bytes(root)
    if needed and free is not None and free < needed:
        raise DiskFullError(
            f"not enough space in the cache {root} for the package of kernel "
            f"{node.kernel_release} ({needed} bytes needed, {free} free); nothing written",
            remedy=f"free at least {needed - free} bytes on that filesystem, or point the "
                   "cache (--cache-dir, DRIVER_CACHE_DIR) at a larger one")
    return needed


def build_command(ctx: Context, node: NodeInfo, running: NodeInfo
                  ) -> tuple[str | None, str | None, str]:
    """(driver version, flavour, the `package build` command) for a package `node` lacks.

    The version is the request when exact, else the driver the node runs now or last
    installed (when it fits the request); the flavour the one asked for, else the loaded
    one, else the GPUs' preferred. Unknown parts are left as upper-case placeholders.
    """
    config, loaded = ctx.config, running.loaded_driver
    version: str | None = None
    if DRIVER_VERSION_RE.match(config.driver_version):
        version = config.driver_version
    else:
        state = read_state(ctx.install_root, ctx.log)
        serving = [v for v in (loaded and loaded.version, state and state.driver_version)
                   if v and (config.driver_version in ("default", "latest")
                             or v.startswith(f"{config.driver_version}."))]
        version = serving[0] if serving else None
    flavours = flavour_order(config.flavour, node)
    flavour = (config.flavour if config.flavour != "auto" else
               (loaded.flavour if loaded is not None and loaded.flavour else None)
               or (flavours[0] if flavours else None))
    release, arch = node.kernel_release, node.kernel_arch
    headers = (f"--kernel-headers-from-apt linux-headers-{release}" if node.os.id == "debian"
               else f"--kernel-headers /lib/modules/{release}/build")
    command = (f"gpu-node-installer package build --nvidia-source NVIDIA-Linux-{arch}-"
               f"{version or 'VERSION'}.run {headers} --driver-version {version or 'VERSION'} "
               f"--flavour {flavour or 'FLAVOUR'} --arch {arch} --repo REPO (then serve REPO "
               "from a mirror in DRIVER_MIRRORS)")
    return version, flavour, command
