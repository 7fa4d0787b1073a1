"""Where packages come from: a preloaded directory, the host cache, and mirrors, in that order.

Each source lists what it offers (`offers()`) and returns a verified `Package` for one
candidate (`get()`), or raises: `PackageNotFoundError` (it does not have it) or an
`IntegrityError`/`DownloadError` (it has it, but broken or out of reach); the fetch stage
then tries the next source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import (
    DiskFullError,
    InstallerError,
    IntegrityError,
    PackageNotFoundError,
    space_for,
)
from installer.packages.cache import Cache, cached_package
from installer.packages.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    ManifestError,
    Package,
    parse_manifest,
    sha256_hex,
)
from installer.packages.repository import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    TARBALL_SUFFIXES,
    Candidate,
    Index,
    IndexFormatError,
    package_path,
    parse_index,
    scan_tree,
)
from installer.packages.tar import unpack_tarball
from installer.packages.tree import read_tree
from installer.stages.fetch.failures import DeadlineExpired
from installer.stages.fetch.local import contained_url, mirror_root
from installer.stages.fetch.parallel import run_parallel
from installer.stages.fetch.progress import Progress
from installer.stages.fetch.urls import check_relpath, join, safe

if TYPE_CHECKING:
    from installer.stages.fetch.download import Downloader


@dataclass(frozen=True)
class Offer:
    """What one source offers: its candidates and version aliases (or why it could not say)."""

    source: str
    index: Index
    error: str | None = None
    exhaustive: bool = True
    remembered: dict[str, str] = field(default_factory=dict)
    failure: InstallerError | None = field(default=None, compare=False)


def check_identity(manifest: Manifest, candidate: Candidate, where: str) -> None:
    """A manifest must be the package the index (or path) said it is."""
    got = (manifest.kernel_release, manifest.driver_version, manifest.flavour)
    want = (candidate.kernel_release, candidate.driver_version, candidate.flavour)
    if got != want or (candidate.arch and candidate.arch != manifest.arch):
        raise ManifestError(f"{where}: manifest is for {'/'.join(got)} {manifest.arch}, "
                            f"expected {'/'.join(want)} {candidate.arch or ''}".rstrip())


def store(cache: Cache, manifest: Manifest, data: bytes, requested: str, source: str
          ) -> Package:
    """Record a package whose blobs are all in the cache; return it, served from the cache."""
    digest = cache.record(manifest, data, requested)
    package = cached_package(cache, digest, verify=False)
    if package is None:
        raise IntegrityError(f"package {manifest.key} vanished from the cache while stored")
    return Package(package.manifest, digest, package.root, source=source)


def commit_tree(cache: Cache, package: Package, data: bytes, requested: str) -> Package:
    """Move a verified, unpacked tree into the cache and return the cached package."""
    for entry in package.manifest.files:
        source = package.root / entry.path
        if source.exists():
            cache.commit(source, entry.sha256)
    return store(cache, package.manifest, data, requested, package.source)


class PreloadedSource:
    """Packages baked into the image: `<kernel>/<driver>/<flavour>/` trees or tarballs."""

    def __init__(self, root: Path, cache: Cache, requested: str) -> None:
        self.root = root
        self.cache = cache
        self.requested = requested
        self.name = f"preloaded {root}"
        self._done: dict[str, Package | InstallerError] = {}

    def offers(self) -> Offer:
        if not self.root.is_dir():
            return Offer(self.name, Index(), error="directory does not exist")
        index_path = self.root / INDEX_NAME
        if index_path.is_file():
            with index_path.open("rb") as handle:
                return Offer(self.name, parse_index(handle.read(MAX_INDEX_BYTES + 1), self.name))
        return Offer(self.name, Index(tuple(scan_tree(self.root, self.name))))

    def get(self, candidate: Candidate) -> Package:
        """The package, verified once per run: a second ask (the offline attempt, then the
        full resolution) gets the same package or error without unpacking again."""
        done = self._done.get(candidate.path)
        if done is None:
            try:
                done = self._get(candidate)
            except InstallerError as exc:
                done = exc
            self._done[candidate.path] = done
        if isinstance(done, InstallerError):
            raise done
        return done

    def _get(self, candidate: Candidate) -> Package:
        tree = self.root / candidate.path
        if (tree / MANIFEST_NAME).is_file():
            package = read_tree(tree, source=self.name)
            check_identity(package.manifest, candidate, str(tree))
            return package
        for suffix in TARBALL_SUFFIXES:
            tarball = tree.with_name(tree.name + suffix)
            if tarball.is_file():
                return self._from_tarball(tarball, candidate)
        raise PackageNotFoundError(f"{self.name} has no {candidate.path}")

    def _from_tarball(self, tarball: Path, candidate: Candidate) -> Package:
        """Unpacked once: every header (and the member list against the manifest) is
        checked before a byte is written; then hashed and moved into the cache."""
        unpacked = unpack_tarball(tarball, self.cache.temp_path("unpacked"))
        package = read_tree(unpacked, source=str(tarball))
        check_identity(package.manifest, candidate, str(tarball))
        manifest_bytes = (unpacked / MANIFEST_NAME).read_bytes()
        return commit_tree(self.cache, package, manifest_bytes, self.requested)


class CacheDamaged(PackageNotFoundError):
    """A cached package lost a file or a file no longer hashes right; the bad blobs are
    gone, so only a source that still holds the package can bring it back."""

    default_remedy = ("give a source that holds the package (--mirror / DRIVER_MIRRORS or "
                      "--preloaded-dir) so it is fetched again")


class CacheSource:
    """Packages earlier runs fetched onto this node (the fast reboot path)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.name = f"cache {cache.root}"

    def offers(self) -> Offer:
        refs = self.cache.refs()
        found = tuple(Candidate(r.driver_version, r.kernel_release, r.arch, r.flavour,
                                package_path(r.kernel_release, r.driver_version, r.flavour,
                                             r.arch),
                                r.digest, r.os, source=self.name) for r in refs)
        remembered: dict[str, str] = {}
        for ref in refs:  # most recently used first
            for request in ref.requested:
                remembered.setdefault(request, ref.driver_version)
        return Offer(self.name, Index(found), remembered=remembered)

    def get(self, candidate: Candidate) -> Package:
        package = (cached_package(self.cache, candidate.manifest_sha256)
                   if candidate.manifest_sha256 else None)
        if package is None:
            raise CacheDamaged(f"{self.name} no longer held {candidate.path} intact: the "
                               "cache was repaired (its damaged or missing files removed)")
        return package



class MirrorSource:
    """A repository served over https://, http:// or file://."""

    def __init__(self, base: str, downloader: Downloader, cache: Cache,
                 others: Callable[[], Sequence[MirrorSource]], *, parallel: int, log: Any,
                 requested: str) -> None:
        self.base = base.rstrip("/")
        self.requested = requested
        self.downloader = downloader
        self.cache = cache
        self.others = others
        self.parallel = parallel
        self.log = log
        self.name = f"mirror {safe(self.base)}"
        self._root: Path | None = None

    def url(self, relpath: str) -> str:
        """The URL of `relpath`; refused (UnsafePathError) if its decoded form climbs out."""
        if self.base.startswith("file://"):
            if self._root is None:
                self._root = mirror_root(self.base)
            return contained_url(self._root, relpath, self.name)
        check_relpath(relpath, self.name)
        return join(self.base, relpath)

    def offers(self) -> Offer:
        data = self.downloader.fetch_bytes(self.url(INDEX_NAME), MAX_INDEX_BYTES,
                                           IndexFormatError)
        return Offer(self.name, parse_index(data, f"mirror {safe(self.base)}"))

    def get(self, candidate: Candidate) -> Package:
        data = self.downloader.fetch_bytes(self.url(f"{candidate.path}/{MANIFEST_NAME}"),
                                           MAX_MANIFEST_BYTES, ManifestError)
        if candidate.manifest_sha256 and sha256_hex(data) != candidate.manifest_sha256:
            raise ManifestError(f"{self.name}: {candidate.path}/{MANIFEST_NAME} differs from "
                                "the digest index.json gives for it")
        manifest = parse_manifest(data, source=f"mirror {safe(self.url(candidate.path))}")
        check_identity(manifest, candidate, f"{self.name} {candidate.path}")
        for entry in manifest.files:  # every path checked before a byte is fetched
            self.url(f"{candidate.path}/{entry.path}")
        self._download_missing(manifest, candidate.path)
        return store(self.cache, manifest, data, self.requested, self.name)

    def _download_missing(self, manifest: Manifest, path: str) -> None:
        todo = {e.sha256: e for e in self.cache.missing(manifest.files)}
        if not todo:
            return
        progress = Progress(sum(e.size for e in todo.values()), self.log)
        self.downloader.progress = progress
        self.log.info("downloading", source=self.name, files=len(todo),
                      bytes=progress.total, skipped=len(manifest.files) - len(todo))
        run_parallel([_bind(self._one, e, path) for e in todo.values()], self.parallel)
        progress.finish()

    def _one(self, entry: FileEntry, path: str) -> None:
        """This mirror first, then the others: a 404, a bad checksum, a refused path or a
        mirror that keeps failing (retries spent) moves this file to the next; a passed
        deadline ends it."""
        mirrors = [self, *(m for m in self.others() if m is not self)]
        failure: Exception | None = None
        for mirror in mirrors:
            temp = self.cache.temp_path(entry.path.rsplit("/", 1)[-1])
            try:
                with space_for(temp, entry.size, partial=temp):
                    mirror.downloader.fetch_file(mirror.url(f"{path}/{entry.path}"), temp,
                                                 size=entry.size, sha256=entry.sha256)
            except (DeadlineExpired, DiskFullError):  # no other mirror would do better
                temp.unlink(missing_ok=True)
                raise
            except InstallerError as exc:
                self.log.warning("file failed on mirror", mirror=mirror.name,
                                 file=entry.path, error=exc.message)
                temp.unlink(missing_ok=True)
                failure = exc
                continue
            self.cache.commit(temp, entry.sha256)
            return
        assert failure is not None
        raise failure


def _bind(fn: Callable[[FileEntry, str], None], entry: FileEntry, path: str
          ) -> Callable[[], None]:
    return lambda: fn(entry, path)
