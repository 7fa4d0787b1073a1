"""nvidia-peermem rebuilt on the node (BUILD_FALLBACK=auto) against the RDMA stack loaded.

The same build root story as the fetch stage's on-node build: the node's kernel build tree
(`/lib/modules/<release>/build`, copied with its links re-rooted: `installer.node.buildtree`),
the kernel's compiler and make in this image, and the module sources of the driver's
*source package* in the host cache (where the on-node build keeps the one it fetched),
plus, on MLNX_OFED/DOCA nodes, OFED's kernel tree (`/usr/src/ofa_kernel/<arch>/<release>`:
its include/ and Module.symvers). The compile itself is `packages.builder.peermem`.
A module built here is kept in the cache (`peermem/<key>.ko`, keyed by the source package,
the kernel, OFED's Module.symvers and the signing certificate), so the next boot loads it
without compiling; whatever is built or found is checked again before it is loaded.
Every failure is `rdma.RebuildFailed` with one line: the GPU install never fails for it.
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import subprocess
import time
import zlib
from pathlib import Path

from installer.context import Context
from installer.errors import InstallerError
from installer.installdir.layout import cache_root
from installer.node import buildtree, kmod, modversions
from installer.node.rdma import RdmaStack, RebuildFailed, module_bytes, ofed_tree
from installer.packages.cache import Cache, cached_package
from installer.packages.manifest import SOURCE_RELEASE, Package
from installer.stages.load.rdma import Rebuild

CACHE_DIR = "peermem"


def rebuilder(ctx: Context) -> Rebuild | None:
    """The rebuild the load stage may call, or None when BUILD_FALLBACK forbids it."""
    if ctx.config.build_fallback != "auto" or ctx.package is None:
        return None
    package = ctx.package
    return lambda stack, release: rebuild(ctx, package, stack, release)


def rebuild(ctx: Context, package: Package, stack: RdmaStack, release: str) -> Path:
    """The rebuilt module's path (in the cache); raises RebuildFailed naming why not."""
    try:
        return _rebuild(ctx, package, stack, release)
    except RebuildFailed:
        raise
    except InstallerError as exc:
        raise RebuildFailed(f"{exc.message}; fix: {exc.remedy}" if exc.remedy
                            else exc.message) from None
    except OSError as exc:
        raise RebuildFailed(f"{exc.filename or 'the work area'}: "
                            f"{exc.strerror or exc}") from None
    except (ValueError, RuntimeError, subprocess.SubprocessError) as exc:
        # an optional module: whatever the node's files do, the install goes on
        raise RebuildFailed(f"{type(exc).__name__}: {exc}"[:300]) from None


def _rebuild(ctx: Context, package: Package, stack: RdmaStack, release: str) -> Path:
    config, manifest = ctx.config, package.manifest
    if ctx.node_info().security.requires_signed_modules and config.build_sign_key is None:
        raise RebuildFailed("the node only loads signed modules and no BUILD_SIGN_KEY/"
                            "BUILD_SIGN_CERT is configured to sign a module built here")
    ofed = ofed_tree(ctx.host, release) if stack.kind == "ofed" else None
    if stack.kind == "ofed" and ofed is None:
        raise RebuildFailed(f"the node runs {stack.text.split(';')[0]} but has no OFED kernel "
                            f"tree for {release} (/usr/src/ofa_kernel/<arch>/{release} with "
                            "Module.symvers); fix: install OFED's kernel sources "
                            "(mlnx-ofed-kernel-dkms or DOCA's doca-ofed), or use DMA-BUF")
    cache = Cache(cache_root(config, ctx.host.roots))
    source = _source_package(cache, package)
    if source is None:
        raise RebuildFailed(
            f"no source package of driver {manifest.driver_version} ({manifest.flavour}, "
            f"{manifest.arch}) in the cache {cache.root} to build it from; fix: publish one "
            "(package build --nvidia-source ... --repo, without --kernel-headers; the on-node "
            "build keeps the one it fetches there), or use DMA-BUF")
    key = _key(source, package, release, ofed, config.build_sign_cert)
    kept = _cached(cache, key)
    if kept is not None:
        ctx.log.info("nvidia-peermem rebuilt before, from the cache", key=key[:12])
        return kept
    tree = buildtree.find_build_tree(ctx.host.roots, release)
    # imported here: compiling stays off every other node's start-up
    from installer.packages.builder.inputs import PackageBuildError
    from installer.packages.builder.peermem import (
        PeermemBuildError,
        PeermemRequest,
        build_peermem,
    )

    started = time.monotonic()
    with cache.run():
        work = cache.temp_path("peermem")
        work.mkdir()
        try:
            headers = buildtree.copy_build_tree(ctx.host.roots, tree,
                                                work / f"linux-headers-{release}")
            (work / "build").mkdir()
            request = PeermemRequest(source, headers, ofed,
                                     nvidia_symvers=_nvidia_symvers(ctx, package, work))
            built = _sign(ctx, build_peermem(request, work / "build", ctx.log), work)
        except PeermemBuildError as exc:  # its own remedy is the condition's generic one
            raise RebuildFailed(exc.message) from None
        except PackageBuildError as exc:  # a missing compiler names its package
            raise RebuildFailed(f"{exc.message}; fix: {exc.remedy}") from None
        path = _keep(cache, key, built)
    ctx.log.info("nvidia-peermem rebuilt on the node", release=release,
                 ofed=str(ofed) if ofed else None,
                 duration_s=round(time.monotonic() - started, 1))
    return path


def _nvidia_symvers(ctx: Context, package: Package, work: Path) -> Path | None:
    """The driver package's nvidia.ko exports (the module loaded now) as Module.symvers
    lines, for modpost to resolve and version peermem's nvidia_p2p_* imports."""
    entry = next((m for m in package.manifest.modules if kmod.normalize(m.name) == "nvidia"),
                 None)
    if entry is None:
        return None
    try:
        crcs = modversions.exported(module_bytes(ctx.host, package.path_of(entry.file)))
    except (OSError, EOFError, zlib.error, lzma.LZMAError, modversions.ModversionsError) as exc:
        raise RebuildFailed(f"the package's nvidia module cannot be read for its exports: "
                            f"{exc}") from None
    path = work / "nvidia.symvers"
    path.write_text(modversions.symvers_text(crcs, "nvidia"))
    return path


def _source_package(cache: Cache, package: Package) -> Package | None:
    """The cache's source package of the same driver version, flavour and arch."""
    manifest = package.manifest
    for ref in cache.refs():
        if (ref.kernel_release, ref.driver_version, ref.flavour, ref.arch) == (
                SOURCE_RELEASE, manifest.driver_version, manifest.flavour, manifest.arch):
            found = cached_package(cache, ref.digest)
            if found is not None:
                return found
    return None


def _sign(ctx: Context, built: Path, work: Path) -> Path:
    """Signed with BUILD_SIGN_KEY/CERT when they are given (as the on-node build signs)."""
    key, cert = ctx.config.build_sign_key, ctx.config.build_sign_cert
    if key is None or cert is None:
        return built
    from installer.packages.builder.inputs import read_module
    from installer.packages.builder.signing import SigningOptions, apply

    signed, _ = apply(SigningOptions(key=key, cert=cert), [read_module(built)], work)
    return signed[0].path


def _key(source: Package, package: Package, release: str, ofed: Path | None,
         cert: Path | None) -> str:
    """What the module built here depends on: sources, the driver package (its nvidia's
    CRCs), kernel, OFED's CRCs, the signer."""
    digest = hashlib.sha256()
    for part in (source.digest, package.digest, release,
                 _file_sha(ofed / "Module.symvers" if ofed else None), _file_sha(cert)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def _file_sha(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "none"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached(cache: Cache, key: str) -> Path | None:
    """A module built before for the same inputs, whose bytes are what was recorded."""
    path = cache.root / CACHE_DIR / f"{key}.ko"
    recorded = cache.root / CACHE_DIR / f"{key}.sha256"
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == recorded.read_text().strip():
            return path
    except OSError:
        pass
    return None


def _keep(cache: Cache, key: str, built: Path) -> Path:
    folder = cache.root / CACHE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.ko"
    tmp = folder / f".{key}.tmp"
    shutil.copyfile(built, tmp)
    tmp.replace(path)
    (folder / f"{key}.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest() + "\n")
    return path
