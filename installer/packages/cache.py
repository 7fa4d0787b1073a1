"""The host package cache: content-addressed blobs, package refs, per-run temp areas, pruning.

Layout under the cache root (default `<install dir>/.cache`):
    blobs/sha256/<aa>/<sha256>   every file (manifests too), stored once whatever package uses it
    refs/<manifest sha256>.json  one per cached package: identity, requested aliases, last use
    tmp/run-<id>/                a run's downloads in progress (flock-held while the run lives)
A file enters `blobs/` only by an atomic rename after its sha256 matched. A run that dies
leaves only its `tmp/run-*` folder, which the next run removes. Blobs are re-hashed when a
package is taken from the cache, so a damaged blob is caught and fetched again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from installer.errors import StagingError, disk_full, space_for
from installer.node.files import read_capped
from installer.node.host import rename_confined
from installer.packages.documents import DocumentError, read_document, read_file
from installer.packages.manifest import (
    HASH_CHUNK,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    ManifestError,
    Package,
    blob_relpath,
    parse_manifest,
)
from installer.packages.tree import hash_file

REF_LIMIT = 64 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CacheError(StagingError):
    """The cache directory cannot be written (disk full, read-only, permissions)."""

    default_remedy = ("check free space and permissions of the cache directory "
                      "(--cache-dir), or remove it to start afresh")


@dataclass(frozen=True)
class CacheRef:
    """A package the cache holds completely, and the version requests it satisfied."""

    digest: str
    driver_version: str
    kernel_release: str
    arch: str
    flavour: str
    os: dict[str, str] | None
    requested: tuple[str, ...]
    last_used: float


class Cache:
    """Content-addressed store; use `with cache.run():` around a fetch."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._run_dir: Path | None = None
        self._lock: IO[str] | None = None

    def blob(self, sha256: str) -> Path:
        return self.root / blob_relpath(sha256)

    @contextlib.contextmanager
    def run(self) -> Iterator[Path]:
        """A private temp folder for this run; stale folders of dead runs are removed first."""
        tmp = self.root / "tmp"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            run_dir, lock = self._claim(tmp)
            run_dir.mkdir()
        except OSError as exc:
            raise disk_full(exc, self.root) or CacheError(
                f"cannot create the cache at {self.root}: {exc.strerror}") from None
        self._run_dir, self._lock = run_dir, lock
        try:
            self._remove_stale(tmp)
            yield run_dir
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                (tmp / f"{run_dir.name}.lock").unlink()
            lock.close()
            self._run_dir, self._lock = None, None

    @staticmethod
    def _claim(tmp: Path) -> tuple[Path, IO[str]]:
        """A run name whose lock file this process holds, taken before its folder exists:
        a folder without a held lock is then always a dead run's. A lock file that a sweep
        unlinked between our open and our flock is given up for a fresh name."""
        while True:
            run_dir = tmp / f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            lock_path = tmp / f"{run_dir.name}.lock"
            lock = lock_path.open("w")
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                if os.stat(lock_path).st_ino == os.fstat(lock.fileno()).st_ino:
                    return run_dir, lock
            lock.close()

    def sweep(self) -> None:
        """Remove what interrupted runs left in tmp/: a run that reuses a cached package
        opens no run of its own, and a killed download must not hold the node's disk until
        the next cold install."""
        tmp = self.root / "tmp"
        with contextlib.suppress(OSError):
            if tmp.is_dir() and not tmp.is_symlink():
                self._remove_stale(tmp)

    def _remove_stale(self, tmp: Path) -> None:
        """Remove run folders and lock files that no live process holds (interrupted runs)."""
        for entry in tmp.iterdir():
            if not entry.name.startswith("run-") or entry == self._run_dir:
                continue
            if entry.suffix == ".lock":
                if not entry.with_suffix("").exists():  # a run killed after removing its folder
                    self._remove_unheld(entry)
                continue
            self._remove_unheld(tmp / f"{entry.name}.lock", entry)

    @staticmethod
    def _remove_unheld(lock_path: Path, folder: Path | None = None) -> None:
        """Remove `folder` and its lock file unless a live run holds the lock."""
        try:
            with lock_path.open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                lock_path.unlink()
        except BlockingIOError:
            return
        except OSError:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def temp_path(self, hint: str) -> Path:
        """A fresh path in this run's temp folder (only valid inside `run()`)."""
        if self._run_dir is None:
            raise RuntimeError("Cache.temp_path outside Cache.run()")
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in hint)[-60:]
        return self._run_dir / f"{uuid.uuid4().hex[:8]}-{safe}"

    def commit(self, tmp: Path, sha256: str) -> Path:
        """Move a verified temp file into the blob store (atomic rename, read-only)."""
        target = self.blob(sha256)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.parent.is_symlink():  # the store's own dirs are real, never followed
                raise OSError(errno.ELOOP, f"{target.parent} is a symbolic link")
            tmp.chmod(0o444)
            rename_confined(tmp, target)  # through descriptors opened in the host root
        except OSError as exc:
            raise disk_full(exc, target.parent) or CacheError(
                f"cannot store {sha256[:12]} in {self.root}: {exc.strerror}") from None
        return target

    def has_blob(self, entry: FileEntry, *, verify: bool = True) -> bool:
        """Whether the blob is present (and, by default, still hashes to its name)."""
        path = self.blob(entry.sha256)
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size != entry.size:
                return False
            return not verify or hash_file(path, entry.size) == (entry.size, entry.sha256)
        except OSError:
            return False

    def missing(self, entries: tuple[FileEntry, ...], *, workers: int = 2) -> list[FileEntry]:
        """The entries without a good blob (hashing runs in threads: hashlib frees the GIL)."""
        unique = list({entry.sha256: entry for entry in entries}.values())
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            present = list(pool.map(self.has_blob, unique))
        bad = {e.sha256 for e, ok in zip(unique, present, strict=True) if not ok}
        for sha in bad:
            with contextlib.suppress(OSError):
                self.blob(sha).unlink()
        return [entry for entry in entries if entry.sha256 in bad]

    def ingest(self, stream: IO[bytes], entry: FileEntry) -> bool:
        """Copy a stream into the store if it matches the entry; False when it does not."""
        tmp = self.temp_path(entry.path)
        digest, size = hashlib.sha256(), 0
        try:
            with tmp.open("wb") as out:
                while chunk := stream.read(min(HASH_CHUNK, entry.size + 1 - size)):
                    size += len(chunk)
                    if size > entry.size:
                        break
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise disk_full(exc, tmp, entry.size) or CacheError(
                f"cannot write {tmp}: {exc.strerror}") from None
        if size != entry.size or digest.hexdigest() != entry.sha256:
            tmp.unlink()
            return False
        self.commit(tmp, entry.sha256)
        return True

    def store_bytes(self, data: bytes) -> str:
        """Store small verified bytes (a manifest) and return their sha256."""
        sha = hashlib.sha256(data).hexdigest()
        if not self.blob(sha).is_file():
            tmp = self.temp_path("manifest.json")
            with space_for(tmp, len(data), partial=tmp):
                tmp.write_bytes(data)
            self.commit(tmp, sha)
        return sha

    # --- refs ------------------------------------------------------------------------------

    def record(self, manifest: Manifest, manifest_data: bytes, requested: str) -> str:
        """Remember a complete package (and which request chose it); return its digest."""
        digest = self.store_bytes(manifest_data)
        old = self._read_ref(self.root / "refs" / f"{digest}.json")
        wanted = set(old.requested if old else ()) | {requested}
        ref = {"digest": digest, "driver_version": manifest.driver_version,
               "kernel_release": manifest.kernel_release, "arch": manifest.arch,
               "flavour": manifest.flavour, "os": manifest.os,
               "requested": sorted(wanted), "last_used": time.time()}
        self._write_ref(digest, ref)
        return digest

    def _write_ref(self, digest: str, ref: dict[str, Any]) -> None:
        refs = self.root / "refs"
        tmp = self.temp_path(f"{digest}.json")
        try:
            refs.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
            rename_confined(tmp, refs / f"{digest}.json")
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise disk_full(exc, refs) or CacheError(
                f"cannot write a ref in {refs}: {exc.strerror}") from None

    def refs(self) -> list[CacheRef]:
        """Cached packages, most recently used first; unreadable refs are ignored."""
        found = [self._read_ref(path) for path in sorted((self.root / "refs").glob("*.json"))]
        return sorted((r for r in found if r is not None), key=lambda r: -r.last_used)

    def manifest_data(self, digest: str) -> bytes | None:
        path = self.blob(digest)
        try:
            data = read_capped(path, MAX_MANIFEST_BYTES + 1)  # a regular file, bounded
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

    @staticmethod
    def _read_ref(path: Path) -> CacheRef | None:
        """A ref, or None when absent or malformed: that package is then fetched again."""
        try:
            data = read_file(path, REF_LIMIT)
            return None if data is None else ref_from_bytes(data, path)
        except DocumentError:
            return None

    def forget(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            (self.root / "refs" / f"{digest}.json").unlink()

    # --- pruning ---------------------------------------------------------------------------

    def prune(self, keep: int, in_use: set[str], parse: Any) -> list[str]:
        """Keep the `keep` most recent packages plus those in use; delete unreferenced blobs.

        `parse` turns manifest bytes into a Manifest (injected to keep this module small).
        Returns the digests of the packages removed.
        """
        refs = self.refs()
        kept = {r.digest for r in refs[:keep]} | (in_use & {r.digest for r in refs})
        removed = [r.digest for r in refs if r.digest not in kept]
        for digest in removed:
            self.forget(digest)
        if removed:
            self._sweep(kept, parse)
        return removed

    def _sweep(self, kept: set[str], parse: Any) -> None:
        """Delete every blob that no kept package (manifest or file) references."""
        live = set(kept)
        for digest in kept:
            data = self.manifest_data(digest)
            if data is None:
                return  # cannot tell what is live: delete nothing
            live |= {entry.sha256 for entry in parse(data).files}
        for blob in (self.root / "blobs" / "sha256").glob("*/*"):
            if blob.name not in live:
                with contextlib.suppress(OSError):
                    blob.unlink()


def ref_from_bytes(data: bytes, path: Path) -> CacheRef:
    """Decode a ref (bounded, strict types; its digest is its file name), or DocumentError."""
    obj = read_document(data, name=path.name, source=str(path.parent), limit=REF_LIMIT)
    texts = ("digest", "driver_version", "kernel_release", "arch", "flavour")
    requested, os_match, used = obj.get("requested", []), obj.get("os"), obj.get("last_used")
    checks = {
        "identity": all(isinstance(obj.get(key), str) for key in texts),
        "digest": f"{obj.get('digest')}.json" == path.name
        and _SHA256.match(str(obj.get("digest"))) is not None,
        "requested": isinstance(requested, list) and all(isinstance(r, str) for r in requested),
        "os": os_match is None or (isinstance(os_match, dict)
                                   and all(isinstance(v, str) for v in os_match.values())),
        "last_used": isinstance(used, int | float) and not isinstance(used, bool),
    }
    bad = [name for name, ok in checks.items() if not ok]
    if bad:
        raise DocumentError(f"{path.name} from {path.parent}: {bad[0]} is missing or mistyped")
    return CacheRef(obj["digest"], obj["driver_version"], obj["kernel_release"], obj["arch"],
                    obj["flavour"], os_match, tuple(requested), float(obj["last_used"]))


def cached_package(cache: Cache, digest: str, *, verify: bool = True) -> Package | None:
    """A package the cache holds whole (blobs re-hashed unless just stored), else None."""
    data = cache.manifest_data(digest)
    if data is None:
        return None
    try:
        manifest = parse_manifest(data, source=f"cache {cache.root}")
    except ManifestError:
        cache.forget(digest)
        return None
    if verify and cache.missing(manifest.files):
        return None
    if not verify and not all(cache.has_blob(e, verify=False) for e in manifest.files):
        return None
    return Package(manifest, digest, cache.root, by_hash=True, source=f"cache {cache.root}")
