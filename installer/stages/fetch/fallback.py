"""Build on the node when no source has a package for its kernel (`BUILD_FALLBACK=auto`).

Refusals come first, before anything is downloaded: signature enforcement without a signing
key, no build tree (`/lib/modules/<release>/build` under the host root), no compiler or
make. Then a *source package* for the wanted version is fetched and verified like any
package, its module sources compiled against the node's tree (`packages.builder.compile`),
signed when a key is configured, and the result assembled as an ordinary package and stored
in the host cache by its manifest digest, exactly as a download would be: the next boot
finds it there and takes the fast path. Everything is built in this run's temp folder of
the cache, which the run removes; a failure leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.compat import gpusupport
from installer.context import Context
from installer.errors import ConfigError, PackageNotFoundError, SignatureRejectedError
from installer.node.facts import NodeInfo
from installer.packages.builder.compile import CompileRequest, compile_modules
from installer.packages.builder.inputs import PackageBuildError, Picked, load_order, scan_modules
from installer.packages.builder.publish import Identity, write_package
from installer.packages.builder.signing import SigningOptions, apply, load_cert, load_key
from installer.packages.builder.source import SOURCE_DIR, is_source, source_tree
from installer.packages.cache import Cache
from installer.packages.manifest import SOURCE_RELEASE, Package
from installer.packages.repository import Candidate, resolve
from installer.packages.tree import read_tree
from installer.stages.fetch.buildtree import copy_build_tree, find_build_tree, kernel_compiler
from installer.stages.fetch.sources import store

HINT = ("or set BUILD_FALLBACK=auto (--build-fallback auto) with a source package in a "
        "repository to build one on the node")


class BuildFallbackError(PackageNotFoundError):
    """No package could be built on the node (exit 5: the remedy names what is missing)."""


class UnsignedBuildError(SignatureRejectedError):
    """The node only loads signed modules and no signing key is configured (exit 8)."""


def with_hint(exc: PackageNotFoundError) -> PackageNotFoundError:
    """`BUILD_FALLBACK=never`: the same error, its remedy naming the on-node build."""
    return type(exc)(exc.message, remedy=f"{exc.remedy}; {HINT}")


def preflight(ctx: Context, node: NodeInfo) -> Path:
    """Every refusal that needs no download; returns the node's build tree."""
    config = ctx.config
    if node.security.requires_signed_modules and config.build_sign_key is None:
        raise UnsignedBuildError(
            "the node only loads signed modules (secure boot, module.sig_enforce or "
            "lockdown) and no key to sign modules built here is configured",
            remedy="set BUILD_SIGN_KEY and BUILD_SIGN_CERT to a key the node trusts (MOK), "
                   "or publish signed packages for this kernel")
    if config.build_sign_key is not None and config.build_sign_cert is not None:
        try:  # a key that cannot sign is refused now, not after minutes of compiling
            load_key(config.build_sign_key, load_cert(config.build_sign_cert))
        except PackageBuildError as exc:
            raise ConfigError(f"BUILD_SIGN_KEY/BUILD_SIGN_CERT: {exc.message}",
                              remedy=exc.remedy) from None
    tree = find_build_tree(ctx.host.roots, node.kernel_release)
    compiler, text = kernel_compiler(tree)
    for tool, why in ((compiler, f"kernel {node.kernel_release} was built with "
                                 f"{text or compiler} and its modules must be too"),
                      ("make", "the kernel's build system needs it")):
        if shutil.which(tool) is None:
            raise BuildFallbackError(
                f"{tool} not found in this image: {why}",
                remedy=f"run the image's build variant (Dockerfile target `build`), which has "
                       f"{tool}, or install {tool} in the image")
    return tree


def choose_source(ctx: Context, node: NodeInfo, candidates: list[Candidate],
                  aliases: dict[str, str]) -> Candidate:
    """The source package for the requested version and flavour, as the sources list it."""
    sources = [c for c in candidates if c.kernel_release == SOURCE_RELEASE]
    as_node = [dataclasses.replace(c, kernel_release=node.kernel_release) for c in sources]
    # as for packages: a version or flavour that cannot drive the node's GPUs is refused
    # (exit 14) before anything is downloaded or compiled; default/latest skip such sources
    allowed = gpusupport.guard(ctx.config.driver_version, ctx.config.flavour, node, as_node,
                               aliases)
    try:
        chosen = resolve(ctx.config.driver_version, as_node, node, flavour=ctx.config.flavour,
                         aliases=aliases, allowed=allowed)
    except PackageNotFoundError:
        raise BuildFallbackError(
            f"no package for kernel {node.kernel_release} and no source package for driver "
            f"{ctx.config.driver_version} in any source to build one from",
            remedy="publish a source package (package build --nvidia-source ... --repo, "
                   "without --kernel-headers) or a package for this kernel") from None
    return sources[as_node.index(chosen)]


def build_missing(ctx: Context, node: NodeInfo, cache: Cache, candidates: list[Candidate],
                  aliases: dict[str, str], get: Callable[[Candidate], Package]) -> Package:
    """Build, cache and return the package this node's kernel lacks."""
    tree = preflight(ctx, node)
    source = get(choose_source(ctx, node, candidates, aliases))
    if not is_source(source.manifest):
        raise BuildFallbackError(f"{source.source}: {source.manifest.key} is not a source "
                                 "package", remedy="republish the source package")
    started = time.monotonic()
    work = cache.temp_path("build")
    try:
        package = _build(ctx, node, cache, source, tree, work)
    except PackageBuildError as exc:
        raise BuildFallbackError(f"building driver {source.manifest.driver_version} for "
                                 f"{node.kernel_release} on the node failed: {exc.message}",
                                 remedy=exc.remedy) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx.log.info("package built on node", driver=package.manifest.driver_version,
                 kernel=node.kernel_release, flavour=package.manifest.flavour,
                 digest=package.digest[:12], duration_s=round(time.monotonic() - started, 1))
    return package


def _materialize(source: Package, dest: Path) -> Path:
    """The module sources as a tree (from the verified cache blobs)."""
    if not any(e.path == f"{SOURCE_DIR}/Kbuild" for e in source.manifest.files):
        raise PackageBuildError(f"source package {source.manifest.key} has no "
                                f"{SOURCE_DIR}/Kbuild", remedy="republish the source package")
    return source_tree(source, dest)


def _build(ctx: Context, node: NodeInfo, cache: Cache, source: Package, tree: Path,
           work: Path) -> Package:
    manifest, config = source.manifest, ctx.config
    work.mkdir()
    sources = _materialize(source, work / "nvidia-source")
    headers = copy_build_tree(ctx.host.roots, tree, work / f"linux-headers-{node.kernel_release}")
    compiled = compile_modules(CompileRequest(
        sources, (headers,), manifest.flavour, manifest.arch,
        user_versions=frozenset({manifest.driver_version})), work / "compile", ctx.log)
    if compiled.release != node.kernel_release:
        raise PackageBuildError(f"the node's build tree is for {compiled.release}, not "
                                f"kernel {node.kernel_release}",
                                remedy=f"install linux-headers-{node.kernel_release}")
    modules = scan_modules(compiled.modules_dir)
    modules, signatures = apply(SigningOptions(key=config.build_sign_key,
                                               cert=config.build_sign_cert), modules, work)
    picked = [Picked(e.path, source.path_of(e.path), e.kind)
              for e in manifest.files if e.kind != "source"]
    provenance: dict[str, Any] = {**compiled.provenance, "nvidia_source": {
        "name": f"source package {manifest.key}", "version": manifest.driver_version,
        "sha256": source.digest}}
    built, data = write_package(
        work / "package", Identity(manifest.driver_version, node.kernel_release,
                                   manifest.flavour), manifest.arch, manifest.os, picked,
        list(manifest.links), modules, load_order(modules), signatures, provenance)
    tree_package = read_tree(work / "package", source="build on node")
    for entry in built.files:
        path = tree_package.root / entry.path
        if not cache.blob(entry.sha256).exists():
            cache.commit(path, entry.sha256)
    return store(cache, built, data, config.driver_version, "build on node")
