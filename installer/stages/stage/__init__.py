"""The stage stage: place the user-mode driver in the install dir and switch to it atomically.

Layout (all links relative, so they resolve inside a container that mounts the install dir
elsewhere, e.g. GKE's `/usr/local/nvidia`):

    <install>/.versions/<driver>-<kernel>-<flavour>/{lib64,bin,drivers,firmware}/...
    <install>/.current  -> .versions/<driver>-<kernel>-<flavour>
    <install>/.previous -> .versions/<older>            (kept for rollback)
    <install>/lib64 -> .current/lib64    (likewise bin, drivers, firmware)

A version directory is built under a temp name and renamed into place only when complete;
the one `rename` of `.current` then switches lib64, bin, drivers and firmware together, so a
crash at any instant leaves the complete old set or the complete new set, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from installer.context import Context
from installer.errors import NO_SPACE, DiskFullError, IntegrityError, StagingError, free_bytes
from installer.installdir import ownership
from installer.installdir.daemons import staged_record
from installer.installdir.layout import (
    CURRENT,
    STAGED_META,
    TOP_LINKS,
    VERSIONS,
    Identity,
    Placed,
    destination,
    version_name,
)
from installer.installdir.readiness import clear_readiness
from installer.installdir.versions import (
    current_name,
    previous_name,
    staged_digest,
    switch_to,
)
from installer.node.host import (
    create_new,
    fsync_dir,
    rename_confined,
    replace_symlink,
    write_atomic,
)
from installer.stages.stage import ima, linker


class FileLike(Placed, Protocol):
    """A manifest file entry (installer.packages.manifest.FileEntry)."""

    @property
    def size(self) -> int: ...
    @property
    def mode(self) -> int: ...


class ManifestLike(Identity, Protocol):
    """The parts of installer.packages.manifest.Manifest that staging reads."""

    @property
    def arch(self) -> str: ...
    @property
    def files(self) -> tuple[FileLike, ...]: ...
    @property
    def ima(self) -> tuple[ima.ImaLike, ...]: ...


class PackageLike(Protocol):
    """installer.packages.manifest.Package: a verified manifest and where its files are."""

    @property
    def manifest(self) -> ManifestLike: ...
    @property
    def digest(self) -> str: ...
    def path_of(self, relpath: str) -> Path: ...


@dataclass(frozen=True)
class StageResult:
    """What was staged and what the install dir points at now."""

    version: str
    install_dir: str
    driver_version: str
    kernel_release: str
    flavour: str
    digest: str
    files: int
    reused: bool
    previous: str | None
    soname_links: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def log_fields(self) -> dict[str, Any]:
        return {"version": self.version, "files": self.files, "reused": self.reused,
                "previous": self.previous}

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "install_dir": self.install_dir,
                "driver_version": self.driver_version, "kernel_release": self.kernel_release,
                "flavour": self.flavour, "digest": self.digest, "files": self.files,
                "reused": self.reused, "previous": self.previous,
                "soname_links": self.soname_links, "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"Staged:          {self.version} ({self.files} files"
                 f"{', already present' if self.reused else ''})",
                 f"Install dir:     {self.install_dir}",
                 f"Previous:        {self.previous or 'none'}"]
        lines += [f"  {link} -> {target}" for link, target in sorted(self.soname_links.items())]
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def run(ctx: Context) -> StageResult:
    """Stage entry point: consumes the fetch stage's Package."""
    package = ctx.package
    if package is None:
        raise StagingError("no driver package to stage (the fetch stage did not run)",
                           remedy="run `install`, or `fetch` before `stage`")
    clear_readiness(ctx.config, ctx.host.roots)
    return stage_package(ctx, package)


def stage_package(ctx: Context, package: PackageLike, *,
                  allow_hardlinks: bool = True) -> StageResult:
    """Build (or reuse) the version directory, switch to it, then tidy up around it."""
    root = ctx.install_root
    manifest = package.manifest
    name = version_name(manifest)
    try:
        (root / VERSIONS).mkdir(parents=True, exist_ok=True)
        ownership.mark(ctx.config, ctx.host.roots)
        reused = staged_digest(root / VERSIONS / name) == package.digest
        if not reused:
            _build_version(root, name, package, allow_hardlinks=allow_hardlinks)
        unchanged = reused and current_name(root) == name
        previous = switch_to(root, name)
        links = linker.soname_links(root / VERSIONS / name / "lib64")
        if ctx.config.driver_root_layout:
            linker.driver_root_layout(root, manifest.arch)
        prune(root)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise disk_full(ctx, root, package) from exc
        raise StagingError(f"cannot stage into {ctx.config.install_dir}: {exc}") from exc
    warnings = linker.refresh_linker(ctx, files_changed=not unchanged)
    return StageResult(name, str(ctx.config.install_dir), manifest.driver_version,
                       manifest.kernel_release, manifest.flavour, package.digest,
                       len(manifest.files), reused, previous, links, tuple(warnings))


def prepare_version(ctx: Context, package: PackageLike) -> str:
    """Build the version directory ahead of `load` without switching to it.

    `install` calls this before the kernel is touched, so that a full disk or a bad file
    fails while the old version still serves; `stage` then only switches.
    """
    root = ctx.install_root
    name = version_name(package.manifest)
    try:
        (root / VERSIONS).mkdir(parents=True, exist_ok=True)
        ownership.mark(ctx.config, ctx.host.roots)
        if staged_digest(root / VERSIONS / name) != package.digest:
            _build_version(root, name, package, allow_hardlinks=True)
    except OSError as exc:  # free the space at once: the old version must stay servable
        shutil.rmtree(root / VERSIONS / f".tmp-{name}-{os.getpid()}", ignore_errors=True)
        if exc.errno in NO_SPACE:
            raise disk_full(ctx, root, package) from exc
        raise StagingError(f"cannot prepare {name} in {ctx.config.install_dir}: "
                           f"{exc.strerror or exc}") from exc
    return name


def disk_full(ctx: Context, root: Path, package: PackageLike) -> DiskFullError:
    """The line for a full disk: where, how many bytes the version needs, how many are free."""
    needed = sum(entry.size for entry in package.manifest.files)
    space = free_bytes(root)
    free = f", {space} free" if space is not None else ""
    return DiskFullError(
        f"disk full (no space left on device): {ctx.config.install_dir} (here {root}) "
        f"needs {needed} bytes for {version_name(package.manifest)}{free}; the previous "
        "version still serves",
        remedy=f"free at least {needed} bytes on the node's filesystem of "
               f"{ctx.config.install_dir}, or point --install-dir at a larger one")


def _build_version(root: Path, name: str, package: PackageLike, *,
                   allow_hardlinks: bool) -> None:
    """Fill a temp directory, then rename it into `.versions/<name>` in one step."""
    versions = root / VERSIONS
    tmp = versions / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for sub in TOP_LINKS:
            (tmp / sub).mkdir(parents=True)
        for entry in package.manifest.files:
            _place(tmp, entry, package.path_of(entry.path), allow_hardlinks=allow_hardlinks)
        ima.set_signatures(tmp, package.manifest.files, package.manifest.ima)
        _package_links(tmp, package)
        linker.make_soname_links(tmp / "lib64")
        _write_meta(tmp, package)
    except BaseException:  # a failure or a signal (SIGTERM) mid-copy leaves no temp dir
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _rename_into_place(root, tmp, name)


def _place(tmp: Path, entry: FileLike, source: Path, *, allow_hardlinks: bool) -> None:
    """Hard-link the verified cache file when it can be shared as is, else copy it.

    A cache blob is never written: a link is made only when the file is read-only (the
    blob's own mode), a copy goes to a new file (O_EXCL), and a path that already exists
    (two manifest files landing on one name) is refused instead of opened for writing.
    """
    target = tmp / destination(entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        raise IntegrityError(f"two files of the package land on {destination(entry)} "
                             f"({entry.path} is the second)",
                             remedy="rebuild the package without colliding file names")
    stat = source.stat()
    if stat.st_size != entry.size:
        raise IntegrityError(f"{entry.path}: {stat.st_size} bytes in the cache, manifest says "
                             f"{entry.size}", remedy="clear the cache and fetch again")
    mode = entry.mode & 0o7777
    if allow_hardlinks and (stat.st_mode & 0o7777) == mode and not mode & 0o222:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another filesystem, or links not allowed: copy instead
    _copy_new(source, target, mode)


def _copy_new(source: Path, target: Path, mode: int) -> None:
    """Copy into a file that did not exist, fsynced before any link can point at it."""
    with source.open("rb") as src, os.fdopen(create_new(target), "wb") as out:
        offset, size = 0, os.fstat(src.fileno()).st_size
        while offset < size:
            sent = os.sendfile(out.fileno(), src.fileno(), offset, size - offset)
            if sent == 0:
                break
            offset += sent
        os.fchmod(out.fileno(), mode)
        os.fsync(out.fileno())


def _package_links(tmp: Path, package: PackageLike) -> None:
    """Links the manifest lists, placed beside their target (ELF SONAMEs override them)."""
    files = {entry.path: entry for entry in package.manifest.files}
    for link in getattr(package.manifest, "links", ()):
        target = files.get(str(PurePosixPath(link.path).parent / link.target))
        if target is None:
            continue
        where = tmp / destination(target)
        linker.symlink(where.name, where.parent / PurePosixPath(link.path).name)


def _write_meta(tmp: Path, package: PackageLike) -> None:
    manifest = package.manifest
    meta = {"digest": package.digest, "driver_version": manifest.driver_version,
            "kernel_release": manifest.kernel_release, "flavour": manifest.flavour,
            "arch": manifest.arch, "files": len(manifest.files),
            "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    daemons = getattr(manifest, "daemons", ())
    if daemons:  # where the agent finds them (installer.installdir.daemons)
        meta["daemons"] = staged_record(manifest.files, daemons)
    write_atomic(tmp / STAGED_META, json.dumps(meta, indent=2).encode())


def _rename_into_place(root: Path, tmp: Path, name: str) -> None:
    """Rename the finished temp dir to its name; an older build of that name steps aside.

    When the old build is the current one, `.current` first moves to the new build, and the
    new build reaches its final name as a hard-linked clone, so `.current` never points at a
    missing directory. Renames go through descriptors opened in the host root.
    """
    versions = root / VERSIONS
    final = versions / name
    if not final.exists():
        rename_confined(tmp, final)
        fsync_dir(versions)
        return
    was_current = current_name(root) == name
    if was_current:
        replace_symlink(root / CURRENT, f"{VERSIONS}/{tmp.name}")
    aside = versions / f".old-{name}-{os.getpid()}"
    rename_confined(final, aside)
    clone = versions / f".clone-{name}-{os.getpid()}"
    shutil.copytree(tmp, clone, symlinks=True, copy_function=os.link)
    rename_confined(clone, final)
    if was_current:
        replace_symlink(root / CURRENT, f"{VERSIONS}/{name}")
    fsync_dir(versions)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)


def rollback(root: Path) -> tuple[str, str]:
    """Switch back to `.previous` (the current version becomes the previous one)."""
    old, new = current_name(root), previous_name(root)
    if not new or not (root / VERSIONS / new / STAGED_META).is_file():
        raise StagingError(f"no previous version to roll back to in {root}",
                           remedy="install the wanted version instead")
    switch_to(root, new)
    return old or "", new


def prune(root: Path) -> list[str]:
    """Remove versions that are neither current nor previous, and leftovers of crashes."""
    keep = {current_name(root), previous_name(root)}
    removed = []
    for entry in sorted((root / VERSIONS).iterdir()):
        if entry.name in keep or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    for stray in root.glob(".*.new-*"):
        stray.unlink(missing_ok=True)
    return removed


@dataclass(frozen=True)
class RollbackResult:
    """Which version was left and which one is current again."""

    left: str
    current: str

    def log_fields(self) -> dict[str, Any]:
        return {"left": self.left, "current": self.current}

    def to_json(self) -> str:
        return json.dumps({"left": self.left, "current": self.current}, indent=2)

    def to_text(self) -> str:
        return f"Rolled back:     {self.left or 'nothing'} -> {self.current}"


def rollback_stage(ctx: Context) -> RollbackResult:
    """`stage --rollback`: readiness goes (the next verify decides), then the switch back."""
    clear_readiness(ctx.config, ctx.host.roots)
    try:
        left, current = rollback(ctx.install_root)
    except OSError as exc:
        raise StagingError(f"cannot roll back in {ctx.config.install_dir}: {exc}") from exc
    return RollbackResult(left, current)
