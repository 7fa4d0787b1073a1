"""The host seam: every read of the node, every command and kernel call goes through here.

Stages never hard-code `/proc` or `/home/...`: they ask a `Host` for paths under its `Roots`
and call its methods. `RealHost` is production (and the real-kernel guest); tests pass a
`RealHost` over a temporary host tree, or the fakes in `installer.testing` for kernel calls.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from installer.config import Config
from installer.errors import UnsupportedNodeError, space_for
from installer.node import confine as _confine
from installer.node import syscalls
from installer.node.files import NodeFileError, NotRegularFile, read_capped


@dataclass(frozen=True)
class Roots:
    """Where the node's filesystems are mounted inside this container."""

    host: Path
    proc: Path
    sys: Path
    dev: Path

    @classmethod
    def from_config(cls, config: Config) -> Roots:
        roots = cls(config.host_root, config.proc_root, config.sys_root, config.dev_root)
        return cls(roots.host, roots.proc, roots.sys, roots.confine(roots.dev))

    def node(self, node_path: PurePosixPath | str) -> Path:
        """Map an absolute path on the node (e.g. the install dir) to its real path here.

        Every symlink on the way is resolved as the node would (absolute targets under the
        host root), so what is written there lands on the node, never in this container.
        """
        return _confine.resolve(self.host, self._relative(node_path))

    def node_entry(self, node_path: PurePosixPath | str) -> Path:
        """Like `node`, but the last component stays as it is: a file we replace or delete
        (a link there is replaced, never written through)."""
        return _confine.resolve(self.host, self._relative(node_path), follow_last=False)

    @staticmethod
    def _relative(node_path: PurePosixPath | str) -> PurePosixPath:
        path = PurePosixPath(node_path)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"not an absolute node path without '..': {node_path}")
        return path.relative_to("/")

    def confine(self, path: Path) -> Path:
        """Resolve symlinks in a path under the host root as the node would see them.

        An absolute link such as `/etc/os-release -> /usr/lib/os-release` must point into
        the host tree, not into this container's own filesystem. Paths elsewhere (a
        --dev-root or --proc-root outside the host root) are returned as they are.
        """
        try:
            relative = path.relative_to(self.host)
        except ValueError:
            return path
        return _confine.resolve(self.host, PurePosixPath(relative.as_posix()))

    def entry(self, path: Path) -> Path:
        """`confine` for a path we create, replace or delete: its parent is resolved, the
        entry itself is not followed."""
        try:
            relative = path.relative_to(self.host)
        except ValueError:
            return path
        return _confine.resolve(self.host, PurePosixPath(relative.as_posix()),
                                follow_last=False)


@dataclass(frozen=True)
class CommandResult:
    """What a host command did; `returncode` 127 means the program does not exist."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Host(Protocol):
    """What stages may do to the node. Kernel operations are added by the load stage."""

    roots: Roots

    def read_text(self, path: Path) -> str | None:
        """The file's text, or None when it does not exist."""
        ...

    def read_bytes(self, path: Path, limit: int = ...) -> bytes | None:
        """Up to `limit` bytes of the file, or None when it does not exist."""
        ...

    def iterdir(self, path: Path) -> Iterator[Path]:
        """Entries of a directory, sorted; nothing when it does not exist."""
        ...

    def readlink(self, path: Path) -> str | None:
        """The target of a symbolic link, or None when it is absent or not a link."""
        ...

    def run(self, argv: Sequence[str], *, timeout: float = ...) -> CommandResult:
        """Run a program (in this container) and capture its output."""
        ...

    # Kernel side (the load stage): raw calls raise OSError with the kernel's errno, and
    # installer.node.kmod maps it to an error with a remedy.
    def finit_module(self, path: Path, params: str, *, flags: int = 0) -> None:
        """Load a module from a file with a parameter string (finit_module(2))."""
        ...

    def delete_module(self, name: str) -> None:
        """Unload a module without blocking (delete_module(2) with O_NONBLOCK)."""
        ...

    def char_device(self, path: Path) -> tuple[int, int, int] | None:
        """(major, minor, permission bits) when `path` is a character device, else None."""
        ...

    def mknod_char(self, path: Path, major: int, minor: int, mode: int) -> None:
        """Create a character device node with exactly `mode`, replacing what is there."""
        ...

    def symlink(self, target: str, link: Path) -> None:
        """Make `link` point at `target`, atomically replacing an existing entry."""
        ...

    def write_sysfs(self, path: Path, text: str) -> None:
        """Write a kernel parameter file in place (sysfs files cannot be renamed over)."""
        ...


class RealHost:
    """The production host: real files under the roots, real subprocesses."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots

    def read_text(self, path: Path) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_bytes(self, path: Path, limit: int = 16 * 1024 * 1024) -> bytes | None:
        try:
            return read_capped(self.roots.confine(path), limit)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except NotRegularFile as exc:  # a FIFO would block, a device never end
            raise NodeFileError(path, exc.strerror or "not a regular file") from None
        except PermissionError as exc:
            raise UnsupportedNodeError(
                f"cannot read {path}: permission denied",
                remedy="run the installer privileged (securityContext.privileged: true)",
            ) from exc

    def iterdir(self, path: Path) -> Iterator[Path]:
        try:
            names = sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in names:
            yield path / name

    def readlink(self, path: Path) -> str | None:
        try:
            return os.readlink(path)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return None

    def run(self, argv: Sequence[str], *, timeout: float = 120.0) -> CommandResult:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found")
        return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)

    def finit_module(self, path: Path, params: str, *, flags: int = 0) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            syscalls.finit_module(fd, params, flags)
        finally:
            os.close(fd)

    def delete_module(self, name: str) -> None:
        syscalls.delete_module(name)

    def char_device(self, path: Path) -> tuple[int, int, int] | None:
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISCHR(info.st_mode):
            return None
        return os.major(info.st_rdev), os.minor(info.st_rdev), stat.S_IMODE(info.st_mode)

    def mknod_char(self, path: Path, major: int, minor: int, mode: int) -> None:
        path = self.roots.entry(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.gni-tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.mknod(tmp, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(tmp, mode)  # mknod's mode is filtered by the umask
        os.replace(tmp, path)

    def symlink(self, target: str, link: Path) -> None:
        link = self.roots.entry(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        replace_symlink(link, target)

    def write_sysfs(self, path: Path, text: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write a file so that readers see the old content or the new, never a part.

    The bytes go to an adjacent temp file, are fsynced, then renamed over `path`; the
    directory is fsynced so the rename survives a power cut. Under a host root the temp
    file is made and renamed through the directory's descriptor (see `replace_symlink`).
    A full disk is DiskFullError, the temp file removed.
    """
    with space_for(path, len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with _names_in(path.parent) as (fd, at):
            tmp = at(f".{path.name}.tmp-{os.getpid()}")
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
                with os.fdopen(create_new(tmp, dir_fd=fd), "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
                os.replace(tmp, at(path.name), src_dir_fd=fd, dst_dir_fd=fd)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
    fsync_dir(path.parent)


def create_new(path: Path | str, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
    """Open a file that must not exist yet (O_EXCL, no link followed): a write never goes
    through an existing path, such as a hard link into the package cache."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   mode, dir_fd=dir_fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or link in `path` durable (best effort on filesystems that refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_by_path_noted = False


def _dir_fd(path: Path) -> int | None:
    """`confine.open_dir`, saying once in the log when writes fall back to paths."""
    global _by_path_noted
    fd = _confine.open_dir(path)
    if fd is None and not _confine.kernel_confines() and not _by_path_noted:
        _by_path_noted = True
        import structlog  # only on kernels without openat2 (before 5.6) or under seccomp

        structlog.get_logger().warning(
            "openat2 unavailable: writes on the node go by path (a link swapped into the "
            "install dir's path while a write runs could redirect it)")
    return fd


@contextlib.contextmanager
def _names_in(directory: Path) -> Iterator[tuple[int | None, Callable[[str], str | Path]]]:
    """`directory`'s descriptor, opened in the host root at this instant, and how to name an
    entry in it for the `*at()` calls (`dir_fd=`); (None, its full path) where writes go by
    path. One shape for every write through a directory, with or without openat2."""
    fd = _dir_fd(directory)
    try:
        yield fd, (lambda name: directory / name) if fd is None else (lambda name: name)
    finally:
        if fd is not None:
            os.close(fd)


def replace_symlink(link: Path, target: str) -> None:
    """Make `link` point at `target` with one atomic rename: readers see old or new.

    Under a host root the link's directory is opened in the root (RESOLVE_IN_ROOT) and
    the link made and renamed through that descriptor, never through the path again.
    """
    with _names_in(link.parent) as (fd, at):
        tmp = at(f".{link.name}.new-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        os.symlink(target, tmp, dir_fd=fd)
        os.replace(tmp, at(link.name), src_dir_fd=fd, dst_dir_fd=fd)


def rename_confined(source: Path, target: Path) -> None:
    """`os.replace(source, target)`, both directories opened in the host root at this
    instant (as `replace_symlink`), so a swapped-in link cannot carry it outside."""
    source_fd = _dir_fd(source.parent)
    if source_fd is None:
        os.replace(source, target)
        return
    try:
        target_fd = source_fd if target.parent == source.parent else _dir_fd(target.parent)
        if target_fd is None:  # the target lies under no host root: its path as given
            os.replace(source, target)
            return
        try:
            os.replace(source.name, target.name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
        finally:
            if target_fd != source_fd:
                os.close(target_fd)
    finally:
        os.close(source_fd)
