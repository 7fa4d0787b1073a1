"""The install dir (and a `--cache-dir`) belong to the installer, and nothing else does.

A privileged writer pointed at `/home/kubernetes` or `/usr/local` must not move kubelet's
`bin/` aside and prune it. So, before any write: a system directory is refused; a directory
is the installer's when it carries the marker file (written on first use) or holds only
names the installer writes; GKE's own driver installer's layout (`lib64/`, `bin/`,
`drivers/`, ... in `/home/kubernetes/bin/nvidia`) is moved aside whole into
`.pre-existing/` (logged; `uninstall` puts it back); anything else is refused untouched.
The marker is written with the first version staged, so a run refused earlier leaves none.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from installer.config import Config
from installer.errors import ConfigError, StagingError
from installer.installdir import layout
from installer.node.confine import EscapeError
from installer.node.host import Roots, fsync_dir, write_atomic

MARKER = ".gpu-node-installer"
BACKUP_DIR = ".pre-existing"
MARKER_TEXT = (b"gpu-node-installer owns this directory: it creates and removes what is here;"
               b" .pre-existing/ holds what was here before it (restored by uninstall)\n")
SYSTEM_DIRS = frozenset(PurePosixPath(p) for p in (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp",
    "/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/local", "/usr/local/bin",
    "/usr/local/lib", "/usr/local/lib64", "/usr/sbin", "/usr/share", "/var", "/var/lib",
    "/var/cache", "/var/log", "/var/tmp", "/home/kubernetes", "/home/kubernetes/bin",
    "/home/kubernetes/containerized_mounter", "/etc/kubernetes", "/var/lib/kubelet",
    "/mnt/stateful_partition"))
OWN_DIRS = (layout.VERSIONS, layout.CACHE_DIR, layout.DRIVER_ROOT_DIR, BACKUP_DIR)
OWN_NAMES = frozenset({*OWN_DIRS, *layout.TOP_LINKS, layout.CURRENT, layout.PREVIOUS,
                       layout.STATE_FILE, layout.READY_FILE, layout.DEVNODES_FILE,
                       layout.CDI_RECORD, layout.CDI_HOOK, layout.LAST_INSTALL_FILE,
                       layout.MIG_RECORD, layout.MIG_REBOOT_RECORD,
                       layout.AGENT_DIR, layout.AGENT_VIEW,  # signal holds readiness there
                       layout.LOCK_FILE, layout.PREPARE_LOCK_FILE, MARKER})
# Written by any run that took the node lock (or `prepare`'s), even one that failed before
# the dir was marked.
RUN_NAMES = frozenset({layout.LOCK_FILE, layout.LAST_INSTALL_FILE,
                       layout.PREPARE_LOCK_FILE})
# What GKE's installers (container-engine-accelerators' COS/Ubuntu installer, COS's
# cos_gpu_installer) leave in /home/kubernetes/bin/nvidia: the driver tree, the overlay
# work dirs of its bind mounts, its download cache and log.
GKE_NAMES = frozenset({"bin", "lib64", "drivers", "firmware", "share", "vulkan",
                       "bin-workdir", "lib64-workdir", "drivers-workdir", "lib-workdir",
                       ".cache", ".checkpoint", "nvidia-installer.log", "installer.log",
                       layout.LOCK_FILE})
# Where those installers put it (GKE's default; cos_gpu_installer's own -host-dir default).
GKE_DIRS = frozenset({PurePosixPath("/home/kubernetes/bin/nvidia"),
                      PurePosixPath("/var/lib/nvidia")})
CACHE_NAMES = frozenset({"blobs", "refs", "tmp", MARKER})
Log = Callable[..., object]


def guard(config: Config, roots: Roots) -> None:
    """Refuse, before anything is written, an install or cache dir the installer may not own."""
    install = roots.node(config.install_dir)
    _refuse_system("--install-dir", config.install_dir, install, roots)
    _refuse_file("--install-dir", config.install_dir, install, roots)
    names = _names(install) - RUN_NAMES
    if names and MARKER not in names and not _adoptable(install, names) and not _gke(
            config, install, names):
        raise ConfigError(
            f"--install-dir {config.install_dir} holds files the installer did not create "
            f"({_sample(names - OWN_NAMES)})",
            remedy="point --install-dir (NVIDIA_INSTALL_DIR_HOST) at an empty or new "
                   "directory of its own, e.g. /home/kubernetes/bin/nvidia")
    _refuse_linked(install, OWN_DIRS)
    if config.cache_dir is not None:
        cache = roots.node(config.cache_dir)
        _refuse_system("--cache-dir", config.cache_dir, cache, roots)
        _refuse_overlap(config)
        _refuse_file("--cache-dir", config.cache_dir, cache, roots)
        names = _names(cache)
        if names and MARKER not in names and not names <= CACHE_NAMES:
            raise ConfigError(
                f"--cache-dir {config.cache_dir} holds files the installer did not create "
                f"({_sample(names - CACHE_NAMES)})",
                remedy="point --cache-dir (DRIVER_CACHE_DIR) at an empty or new directory, "
                       "or leave it unset (<install dir>/.cache)")
    _refuse_linked(layout.cache_root(config, roots), ("blobs", "blobs/sha256", "refs", "tmp"))


def guard_cdi(config: Config, roots: Roots) -> None:
    """Refuse, before anything is written, a CDI spec dir that cannot hold our spec (it, or
    a directory above it, is a file) and a CDI record that is not a file: the spec is
    written last, so finding out there would fail an install that had already switched."""
    if config.cdi != "on":
        return
    _refuse_file("--cdi-spec-dir", config.cdi_spec_dir, roots.node(config.cdi_spec_dir), roots)
    record = roots.node(config.install_dir) / layout.CDI_RECORD
    if record.exists() and not record.is_symlink() and not record.is_file():
        raise StagingError(f"{record} is not a regular file",
                           remedy=f"remove {layout.CDI_RECORD} from the install dir and rerun")


def claim(config: Config, roots: Roots, log: Log) -> None:
    """Under the node lock: move a GKE installer's files aside, and mark the dir ours."""
    install = roots.node(config.install_dir)
    names = _names(install)
    if MARKER not in names and _gke(config, install, names - RUN_NAMES - {BACKUP_DIR}):
        moved = move_aside(install, sorted(names - RUN_NAMES - {BACKUP_DIR}))
        log("moved the files of GKE's driver installer aside", install_dir=str(
            config.install_dir), backup=f"{config.install_dir}/{BACKUP_DIR}", entries=moved)
        write_atomic(install / MARKER, MARKER_TEXT)


def mark(config: Config, roots: Roots) -> None:
    """Write the marker on first use (the stage that puts a version there calls this)."""
    for node_path in (config.install_dir, config.cache_dir):
        if node_path is not None:
            path = roots.node(node_path)
            if not (path / MARKER).is_file():
                write_atomic(path / MARKER, MARKER_TEXT)


def ours(install: Path) -> bool:
    """Whether the installer may remove its names here: marked, or laid out by it."""
    return (install / MARKER).is_file() or _adoptable(install, _names(install))


def unmark(install: Path) -> None:
    """Drop the marker (uninstall, once what was here before is back)."""
    (install / MARKER).unlink(missing_ok=True)


def move_aside(install: Path, names: list[str]) -> list[str]:
    """Move entries into `.pre-existing/` (never deleted; `uninstall` restores them)."""
    backup = install / BACKUP_DIR
    backup.mkdir(exist_ok=True)
    moved = []
    for name in names:
        target = backup / name
        suffix = 0
        while target.exists() or target.is_symlink():
            suffix += 1
            target = backup / f"{name}.{suffix}"
        os.rename(install / name, target)
        moved.append(name)
    fsync_dir(backup)
    fsync_dir(install)
    return moved


def restore_aside(install: Path) -> list[str]:
    """Put back what `.pre-existing/` holds (uninstall); a name taken since stays there."""
    backup = install / BACKUP_DIR
    if backup.is_symlink() or not backup.is_dir():
        return []
    restored = []
    for entry in sorted(backup.iterdir()):
        if not (install / entry.name).exists() and not (install / entry.name).is_symlink():
            os.rename(entry, install / entry.name)
            restored.append(entry.name)
    if not any(backup.iterdir()):
        backup.rmdir()
    fsync_dir(install)
    return restored


def _refuse_system(flag: str, setting: PurePosixPath, real: Path, roots: Roots) -> None:
    node = PurePosixPath("/", real.relative_to(roots.host).as_posix())
    for path in {setting, node}:
        if path in SYSTEM_DIRS:
            shown = f"{setting}" if path == setting else f"{setting} (on the node: {node})"
            raise ConfigError(
                f"{flag} {shown} is a system directory; the installer creates and removes "
                "files in it", remedy=f"point {flag} at a directory of its own, e.g. "
                "/home/kubernetes/bin/nvidia (install) or its .cache (cache)")


def _refuse_overlap(config: Config) -> None:
    """A --cache-dir sharing the install dir's names would be switched, pruned or uninstalled
    with it: only the default `<install dir>/.cache` (or a directory of its own) is safe."""
    install, cache = config.install_dir, config.cache_dir
    if cache is None:
        return
    inside = cache.relative_to(install).parts if cache.is_relative_to(install) else None
    if install.is_relative_to(cache):
        why = "is the install dir" if cache == install else "holds the install dir"
    elif inside and inside[0] in OWN_NAMES - {layout.CACHE_DIR}:
        why = f"lies in {inside[0]}/, which the installer switches, prunes or removes"
    else:
        return
    raise ConfigError(f"--cache-dir {cache} {why} (--install-dir {install})",
                      remedy="leave --cache-dir (DRIVER_CACHE_DIR) unset for <install dir>/"
                             ".cache, or point it at a directory outside the install dir")


def _refuse_file(flag: str, setting: PurePosixPath, real: Path, roots: Roots) -> None:
    """The dir, or a directory above it, is an existing file: nothing can be created there.
    `real` is the setting resolved on the node (a link to a file is said as such)."""
    for path in (real, *real.parents):
        if path == roots.host or not path.is_relative_to(roots.host):
            return
        if path.exists() and not path.is_dir():
            node = PurePosixPath("/", path.relative_to(roots.host).as_posix())
            what = "is a file" if node == setting else f"leads to {node}, a file" \
                if path == real else f"cannot be created: {node} is a file"
            raise ConfigError(f"{flag} {setting} {what}, not a directory",
                              remedy=f"remove or rename that file, or point {flag} at a "
                                     "directory")


def _refuse_linked(base: Path, names: tuple[str, ...]) -> None:
    """The installer's own directories must be real ones: it writes below them by name."""
    for name in names:
        if (base / name).is_symlink():
            raise EscapeError(f"{base / name} is a symbolic link; the installer's own "
                              "directories must be real directories",
                              remedy=f"remove the link {base / name} (the installer "
                                     "recreates the directory)")


def _names(path: Path) -> set[str]:
    try:
        return set(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        raise ConfigError(f"cannot list {path}: {exc.strerror}") from None


def _adoptable(install: Path, names: set[str]) -> bool:
    """An install dir of an installer version from before the marker: only our names, a
    `.versions` directory, and the top names as links (never a real bin/ or lib64/)."""
    if not names <= OWN_NAMES or (layout.DRIVER_ROOT_DIR in names
                                  and not (install / layout.VERSIONS).is_dir()):
        return False
    return (any((install / n).is_dir() for n in (layout.VERSIONS, layout.CACHE_DIR, BACKUP_DIR))
            and not any((install / n).is_dir() and not (install / n).is_symlink()
                        for n in layout.TOP_LINKS))


def _gke(config: Config, install: Path, names: set[str]) -> bool:
    """GKE's installer's layout: in its place, only its names, a real lib64/, bin/ or
    drivers/ (elsewhere a bin/ is someone else's)."""
    return config.install_dir in GKE_DIRS and names <= GKE_NAMES | {BACKUP_DIR} and any(
        (install / n).is_dir() and not (install / n).is_symlink()
        for n in ("lib64", "bin", "drivers"))


def _sample(names: set[str]) -> str:
    shown = sorted(names)[:3]
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
