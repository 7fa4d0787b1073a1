"""The fetch stage: resolve the driver version for this node and get its package, verified.

Sources in order: the preloaded directory, the host cache, the mirrors (and, when none has
a package for the kernel and BUILD_FALLBACK=auto, a build on the node: `fallback`). Versions are
resolved once over everything the sources offer (`repository.resolve`), then the first
source that holds the chosen package and delivers it intact wins. `available()` backs the
`versions` command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from installer.compat import gpusupport
from installer.context import Context
from installer.errors import (
    IncompatibleError,
    InstallerError,
    IntegrityError,
    PackageNotFoundError,
)
from installer.installdir.layout import cache_root
from installer.installdir.state import read_state
from installer.node.facts import NodeInfo
from installer.packages.cache import Cache
from installer.packages.cos import layout as cos_layout
from installer.packages.manifest import DRIVER_VERSION_RE, FLAVOURS, Package, parse_manifest
from installer.packages.repository import (
    Candidate,
    Index,
    flavour_order,
    offered_for_kernel,
    package_path,
    resolve,
)
from installer.stages.fetch.failures import DeadlineExpired, SourceFailure, combined
from installer.stages.fetch.sources import CacheSource, MirrorSource, Offer, PreloadedSource


class Source(Protocol):
    name: str

    def offers(self) -> Offer: ...

    def get(self, candidate: Candidate) -> Package: ...


def run(ctx: Context, *, prune: bool = True) -> Package:
    """Stage entry point: the verified package for this node (also stored by the runner).

    `prune=False` only adds to the cache (`prepare`, which runs beside installs and must
    not sweep blobs an install is still committing)."""
    node = ctx.node_info()
    with _sources(ctx) as (cache, sources):
        package = _local_exact(ctx, node, sources) or _resolve_and_get(ctx, node, sources,
                                                                       cache)
        data = cache.manifest_data(package.digest)
        if data is not None:  # a preloaded tree is not in the cache; note the use otherwise
            cache.record(package.manifest, data, ctx.config.driver_version)
        if prune:
            _prune(ctx, cache, package)
        return package


def _local_exact(ctx: Context, node: NodeInfo, sources: list[Source]) -> Package | None:
    """An exact version the preloaded dir or the cache holds needs no network at all."""
    if not DRIVER_VERSION_RE.match(ctx.config.driver_version):
        return None
    local: list[Source] = [s for s in sources if isinstance(s, PreloadedSource | CacheSource)]
    offers = gather(local, ctx.log)
    try:
        choice = choose(ctx, node, offers)
        return get_first(local, offers, choice, ctx.log)
    except InstallerError:
        return None


def _resolve_and_get(ctx: Context, node: NodeInfo, sources: list[Source], cache: Cache
                     ) -> Package:
    offers = gather(sources, ctx.log)
    try:
        choice = choose(ctx, node, offers)
    except PackageNotFoundError as exc:  # perhaps because a source failed: say which, why
        failed = [SourceFailure(o.source, o.failure) for o in offers if o.failure is not None]
        if not failed:
            # imported here: the on-node build (compiler driving, signing) stays off the
            # fast path's start-up
            from installer.stages.fetch import fallback

            if ctx.config.build_fallback == "never":
                raise fallback.with_hint(_without_mirrors(ctx, exc)) from None
            return fallback.build_missing(
                ctx, node, cache, [c for o in offers for c in o.index.packages],
                _aliases(offers), lambda c: get_first(sources, offers, c, ctx.log))
        answered = any(o.index.packages for o in offers if o.failure is None)
        what = exc.message if answered else (
            f"no source could list driver {ctx.config.driver_version} for kernel "
            f"{node.kernel_release}")
        raise combined(what, failed) from None
    return get_first(sources, offers, choice, ctx.log)


@contextmanager
def _sources(ctx: Context) -> Iterator[tuple[Cache, list[Source]]]:
    """The sources in their order; the downloader (and requests) only when mirrors exist."""
    config = ctx.config
    cache = Cache(cache_root(ctx.config, ctx.host.roots))
    requested = config.driver_version
    sources: list[Source] = []
    if config.preloaded_dir is not None:
        sources.append(PreloadedSource(config.preloaded_dir, cache, requested))
    sources.append(CacheSource(cache))
    node = ctx.node_info()
    use_cos = config.cos_source == "auto" and cos_layout.on_cos_build(node.os)
    use_ubuntu = config.ubuntu_source == "auto" and node.os.id == "ubuntu"
    downloader = None
    if config.mirrors or use_cos or use_ubuntu:
        from installer.stages.fetch.download import Downloader, DownloadSettings

        downloader = Downloader(DownloadSettings(
            connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
            deadline=config.download_deadline, attempts=config.download_retries,
            parallel=config.download_parallel, ca_bundle=config.ca_bundle,
            allow_http=config.allow_http), ctx.log)
    if downloader is not None and use_cos:
        # imported here: assembling (package build, crc32c) stays off other nodes' start-up
        from installer.stages.fetch import cos

        sources.append(cos.CosSource(node, cos.CosSettings(
            cos_tools_url=config.cos_tools_url, runfile_url=config.nvidia_runfile_url,
            zone=config.node_zone), downloader, cache, ctx.log, requested))
    if downloader is not None and use_ubuntu:
        from installer.stages.fetch import ubuntu

        sources.append(ubuntu.UbuntuSource(node, ubuntu.UbuntuSettings(
            config.ubuntu_apt_mirror, config.ubuntu_keyring), downloader, cache, ctx.log,
            requested))
    if downloader is not None and config.mirrors:
        mirrors: list[MirrorSource] = []
        for base in config.mirrors:
            mirrors.append(MirrorSource(base, downloader, cache, lambda: mirrors,
                                        parallel=config.download_parallel, log=ctx.log,
                                        requested=requested))
        sources.extend(mirrors)
    try:
        with cache.run():
            yield cache, sources
    finally:
        if downloader is not None:
            downloader.close()


def gather(sources: list[Source], log: Any) -> list[Offer]:
    """Ask every source what it offers; one that cannot answer is noted, not fatal (unless
    the download deadline passed: then nothing more can be asked)."""
    offers = []
    for source in sources:
        try:
            offer = source.offers()
        except DeadlineExpired as exc:
            log.warning("source unavailable", source=source.name, reason=exc.message)
            raise
        except InstallerError as exc:
            reason = "no index.json" if isinstance(exc, PackageNotFoundError) else exc.message
            offer = Offer(source.name, Index(), error=reason, failure=exc,
                          exhaustive=isinstance(exc, IntegrityError)  # refused: not probed
                          or not isinstance(source, MirrorSource))
        if offer.error:
            log.warning("source unavailable", source=source.name, reason=offer.error)
        offers.append(offer)
    return offers


def _aliases(offers: list[Offer]) -> dict[str, str]:
    """Each alias from the first index that defines it; when a source could not answer,
    also what the cache remembers choosing for the same request (offline reboots)."""
    merged: dict[str, str] = {}
    for offer in offers:
        for name, target in offer.index.aliases.items():
            merged.setdefault(name, target)
    if any(offer.error for offer in offers):
        for offer in offers:
            for name, target in offer.remembered.items():
                merged.setdefault(name, target)
    return merged


def _candidates(offers: list[Offer], node: NodeInfo, requested: str, flavours: tuple[str, ...]
                ) -> list[Candidate]:
    """Every offered candidate; for an exact version, probes where a source has no index."""
    found = [c for offer in offers for c in offer.index.packages]
    if DRIVER_VERSION_RE.match(requested):
        for offer in offers:
            if not offer.exhaustive:
                found.extend(Candidate(requested, node.kernel_release, node.kernel_arch, f,
                                       package_path(node.kernel_release, requested, f,
                                                    node.kernel_arch),
                                       source=offer.source) for f in flavours)
    return found


def choose(ctx: Context, node: NodeInfo, offers: list[Offer]) -> Candidate:
    config = ctx.config
    flavours = flavour_order(config.flavour, node)
    candidates = _candidates(offers, node, config.driver_version, flavours or FLAVOURS)
    # GPU/driver compatibility: refuses an unsupported request now, filters default/latest.
    allowed = gpusupport.guard(config.driver_version, config.flavour, node,
                           [c for c in candidates if c.kernel_release == node.kernel_release],
                           _aliases(offers))
    choice = resolve(config.driver_version, candidates, node, flavour=config.flavour,
                     aliases=_aliases(offers), allowed=allowed)
    ctx.log.info("driver resolved", requested=config.driver_version,
                 driver=choice.driver_version, flavour=choice.flavour,
                 kernel=choice.kernel_release)
    return choice


def get_first(sources: list[Source], offers: list[Offer], choice: Candidate, log: Any
              ) -> Package:
    """The first source that lists the choice and delivers it intact; when none does, one
    error naming each source's cause, coded by the most telling one (`failures.py`)."""
    failures: list[SourceFailure] = []
    for source, offer in zip(sources, offers, strict=True):
        listed = [c for c in offer.index.packages if _same(c, choice)]
        if not listed and offer.exhaustive:
            continue
        if offer.failure is not None:
            failures.append(SourceFailure(source.name, offer.failure))
        try:
            wanted = listed[0] if listed else choice
            return source.get(replace(wanted, arch=wanted.arch or choice.arch))
        except InstallerError as exc:
            log.warning("source failed", source=source.name, error=exc.slug,
                        reason=exc.message)
            if isinstance(exc, DeadlineExpired):
                raise
            failures.append(SourceFailure(source.name, exc))
    raise combined(f"no source delivered {choice.path}", failures)


def _same(a: Candidate, b: Candidate) -> bool:
    return (a.kernel_release, a.driver_version, a.flavour) == (
        b.kernel_release, b.driver_version, b.flavour) and a.arch in ("", b.arch or a.arch)


def _in_use(ctx: Context) -> set[str]:
    """The digest the install dir's state names: never pruned while staged."""
    state = read_state(ctx.install_root, ctx.log)
    return {state.package_digest} if state else set()


def _prune(ctx: Context, cache: Cache, package: Package) -> None:
    removed = cache.prune(ctx.config.cache_keep, {package.digest, *_in_use(ctx)},
                          parse_manifest)
    if removed:
        ctx.log.info("cache pruned", packages=[d[:12] for d in removed])


# ---------------------------------------------------------------- versions command


@dataclass
class Versions:
    """What the sources offer for this node, and what the request resolves to."""

    kernel_release: str
    arch: str
    requested: str
    flavours: tuple[str, ...]
    sources: list[dict[str, Any]] = field(default_factory=list)
    resolved: str | None = None
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kernel_release": self.kernel_release, "arch": self.arch,
                "requested": self.requested, "flavours": list(self.flavours),
                "resolved": self.resolved, "problem": self.problem, "sources": self.sources}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"kernel {self.kernel_release} {self.arch}; flavours "
                 f"{'/'.join(self.flavours) or 'none'}"]
        for source in self.sources:
            offered = ", ".join(f"{v} ({'/'.join(f)})" for v, f in source["versions"].items())
            state = f" [{source['error']}]" if source["error"] else ""
            lines.append(f"  {source['source']}{state}: {offered or 'nothing for this kernel'}")
            if source["aliases"]:
                lines.append("    aliases: " + ", ".join(
                    f"{name} -> {target}" for name, target in sorted(source["aliases"].items())))
        lines.append(f"{self.requested} -> {self.resolved or 'nothing: ' + str(self.problem)}")
        return "\n".join(lines)

    def log_fields(self) -> dict[str, Any]:
        return {"requested": self.requested, "resolved": self.resolved}


def _without_mirrors(ctx: Context, exc: PackageNotFoundError) -> PackageNotFoundError:
    """No mirror configured is the likeliest cause on a fresh deploy: say so, and how."""
    if ctx.config.mirrors:
        return exc
    return type(exc)(f"{exc.message}; no mirror is set (DRIVER_MIRRORS is empty)",
                     remedy="set DRIVER_MIRRORS (--mirror) to a driver repository "
                            f"(docs/package-format.md); or {exc.remedy}")


def available(ctx: Context) -> Versions:
    """Ask every source; report what each has for this kernel and what would be chosen."""
    node = ctx.node_info()
    with _sources(ctx) as (_cache, sources):
        offers = gather(sources, ctx.log)
    result = Versions(node.kernel_release, node.kernel_arch, ctx.config.driver_version,
                      flavour_order(ctx.config.flavour, node))
    for offer in offers:
        result.sources.append({"source": offer.source, "error": offer.error,
                               "aliases": offer.index.aliases,
                               "versions": offered_for_kernel(offer.index.packages,
                                                              node.kernel_release)})
    try:
        choice = choose(ctx, node, offers)
        result.resolved = f"{choice.driver_version} ({choice.flavour})"
    except (PackageNotFoundError, IncompatibleError) as exc:
        result.problem = exc.message
    return result
