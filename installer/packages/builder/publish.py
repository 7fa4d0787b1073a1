"""Write a built package: files hashed while copied, manifest, atomic swap, tarball, index.

Everything lands in a temp directory beside its destination and is renamed into place
only when complete (over an old package: one `renameat2(RENAME_EXCHANGE)`, so the place is
never empty); `index.json` is replaced atomically (fsynced temp, rename), so a reader never
sees half. A package replaced by other contents is first withdrawn from the index, so a
SIGKILL at any instant leaves an index that lists only packages holding what it says.
Builds of one place take a lock beside it and remove what killed runs left there.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import space_for
from installer.node.host import write_atomic
from installer.node.syscalls import exchange
from installer.packages.builder.inputs import (
    COPY_CHUNK,
    KIND_MODES,
    ModuleInfo,
    PackageBuildError,
    Picked,
)
from installer.packages.daemons import DaemonEntry
from installer.packages.ima import ImaEntry
from installer.packages.manifest import (
    MANIFEST_NAME,
    FileEntry,
    LinkEntry,
    Manifest,
    ModuleEntry,
    dump_manifest,
    manifest_from_dict,
    manifest_to_dict,
    sha256_hex,
)
from installer.packages.repository import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    Candidate,
    Index,
    index_to_bytes,
    parse_index,
    with_package,
)
from installer.packages.signatures import SignatureEntry


@dataclass(frozen=True)
class Identity:
    """Who the package is: driver version, kernel release, module flavour."""

    driver_version: str
    kernel_release: str
    flavour: str


def write_package(destination: Path, identity: Identity, arch: str,
                  os_info: dict[str, str] | None, picked: list[Picked], links: list[LinkEntry],
                  modules: list[ModuleInfo], ordered: list[ModuleInfo],
                  signatures: tuple[SignatureEntry, ...], provenance: dict[str, Any] | None,
                  *, ima: Mapping[str, bytes] | None = None, repo: Path | None = None,
                  daemons: tuple[DaemonEntry, ...] = (),
                  optional: tuple[ModuleInfo, ...] = ()) -> tuple[Manifest, bytes]:
    """Copy and hash every file into a temp dir beside `destination`, then swap it in
    (with `repo`: after withdrawing an index entry that names other contents for it)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with _place_lock(destination):
        tmp = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
        try:
            picked = [_firmware_home(item, identity.driver_version) for item in picked]
            ima_entries = _ima_entries(picked, ima or {})
            module_files = [Picked(f"modules/{m.path.name}", m.path, "module")
                            for m in modules]
            entries = [_copy(item, tmp) for item in sorted(picked + module_files,
                                                           key=lambda p: p.relpath)]
            manifest = manifest_from_dict(manifest_to_dict(Manifest(
                1, identity.driver_version, identity.kernel_release, arch,
                identity.flavour, os_info, tuple(entries),
                tuple(ModuleEntry(m.name, f"modules/{m.path.name}", m.depends, {})
                      for m in ordered), tuple(links), signatures, provenance, ima_entries,
                daemons, tuple(ModuleEntry(m.name, f"modules/{m.path.name}", m.depends, {})
                               for m in optional))))
            data = dump_manifest(manifest)
            (tmp / MANIFEST_NAME).write_bytes(data)
            tmp.chmod(0o755)
            if repo is not None:
                withdraw(repo, manifest, sha256_hex(data))
            _swap_into_place(tmp, destination)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest, data


@contextlib.contextmanager
def _place_lock(destination: Path) -> Iterator[None]:
    """One build of a place at a time; what killed builds left beside it is removed."""
    lock_path = destination.with_name(f".{destination.name}.lock")
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in destination.parent.glob(f".{glob.escape(destination.name)}.*"):
            if stale == lock_path:
                continue
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        yield


def _ima_entries(picked: list[Picked], ima: Mapping[str, bytes]) -> tuple[ImaEntry, ...]:
    """Each IMA signature (by firmware file name) on the firmware file it signs."""
    firmware = {item.relpath.rsplit("/", 1)[-1]: item.relpath for item in picked
                if item.kind == "firmware"}
    unknown = sorted(set(ima) - set(firmware))
    if unknown:
        raise PackageBuildError(f"an IMA signature is given for {unknown[0]}, which is not a "
                                "firmware file of the package")
    return tuple(ImaEntry(firmware[name], ima[name]) for name in sorted(ima))


def _firmware_home(item: Picked, version: str) -> Picked:
    """GSP firmware goes where the module asks for it: `nvidia/<version>/` (the .run is flat)."""
    prefix = f"firmware/nvidia/{version}/"
    if item.kind != "firmware" or item.relpath.startswith(prefix):
        return item
    return Picked(prefix + item.relpath.rsplit("/", 1)[-1], item.source, item.kind)


def _copy(item: Picked, root: Path) -> FileEntry:
    """Copy one file while hashing it (one pass) and give it its kind's fixed mode."""
    target = root / item.relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with space_for(target, item.source.stat().st_size, partial=target), \
            item.source.open("rb") as source, target.open("wb") as out:
        while chunk := source.read(COPY_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    mode = KIND_MODES[item.kind]
    target.chmod(mode)
    return FileEntry(item.relpath, size, digest.hexdigest(), mode, item.kind)


def _swap_into_place(tmp: Path, destination: Path) -> None:
    """`tmp` becomes `destination` in one step; the old package is then removed."""
    if not destination.exists():
        os.rename(tmp, destination)
        return
    if exchange(tmp, destination):  # tmp now holds the old package
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    os.rename(destination, old)  # no RENAME_EXCHANGE here: a short gap, never a mix
    os.rename(tmp, destination)
    shutil.rmtree(old, ignore_errors=True)


def write_tarball(directory: Path, target: Path) -> Path:
    """A reproducible tar.gz of the package (sorted names, fixed owner and times)."""
    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with space_for(target, None, partial=tmp), tmp.open("wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw,
                              mtime=0) as compressed, \
                tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(p for p in directory.rglob("*") if p.is_file()):
                archive.add(path, arcname=path.relative_to(directory).as_posix(), filter=clean)
        os.replace(tmp, target)
    except BaseException:  # nothing half-written stays beside the repository
        tmp.unlink(missing_ok=True)
        raise
    return target


@contextlib.contextmanager
def _index_lock(repo: Path) -> Iterator[Index]:
    """The index as it is, read under an exclusive lock on `<repo>/.index.json.lock`, so
    builds finishing together (threads of one command, or two commands) lose nothing;
    temp files of killed writers are removed under it."""
    repo.mkdir(parents=True, exist_ok=True)
    with (repo / f".{INDEX_NAME}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in repo.glob(f".{INDEX_NAME}.tmp-*"):  # a killed writer's
            stale.unlink(missing_ok=True)
        path = repo / INDEX_NAME
        index = Index()
        if path.exists():
            with path.open("rb") as handle:
                index = parse_index(handle.read(MAX_INDEX_BYTES + 1), str(path))
        yield index


def _candidate(manifest: Manifest, digest: str) -> Candidate:
    return Candidate(manifest.driver_version, manifest.kernel_release, manifest.arch,
                     manifest.flavour, manifest.key, digest, manifest.os)


def withdraw(repo: Path, manifest: Manifest, digest: str) -> None:
    """Before a package's directory is replaced: an index entry for its place that names
    another digest goes (it would name a manifest the directory no longer holds)."""
    if not (repo / INDEX_NAME).exists():
        return
    key = _candidate(manifest, digest).key
    with _index_lock(repo) as index:
        kept = tuple(c for c in index.packages if c.key != key or c.manifest_sha256 == digest)
        if len(kept) != len(index.packages):
            write_atomic(repo / INDEX_NAME, index_to_bytes(Index(kept, index.aliases)))


def update_index(repo: Path, manifest: Manifest, digest: str, alias_names: tuple[str, ...]
                 ) -> tuple[Path, dict[str, str]]:
    """Add the package to `<repo>/index.json` (creating it), set aliases, write atomically."""
    aliases = {name: manifest.driver_version for name in alias_names}
    with _index_lock(repo) as index:
        write_atomic(repo / INDEX_NAME,
                     index_to_bytes(with_package(index, _candidate(manifest, digest), aliases)))
    return repo / INDEX_NAME, aliases
