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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from installer.config import Config
from installer.errors import UnsupportedNodeError
from installer.node import syscalls


@dataclass(frozen=True)
class Roots:
    """Where the node's filesystems are mounted inside this container."""

    host: Path
    proc: Path
    sys: Path
    dev: Path

    @classmethod
    def from_config(cls, config: Config) -> Roots:
        return cls(config.host_root, config.proc_root, config.sys_root, config.dev_root)

    def node(self, node_path: PurePosixPath | str) -> Path:
        """Map an absolute path on the node (e.g. the install dir) to its path here."""
        path = PurePosixPath(node_path)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"not an absolute node path without '..': {node_path}")
        return self.host / path.relative_to("/")

    def confine(self, path: Path) -> Path:
        """Resolve symlinks in a path under the host root as the node would see them.

        An absolute link such as `/etc/os-release -> /usr/lib/os-release` must point into
        the host tree, not into this container's own filesystem.
        """
        try:
            relative = path.relative_to(self.host)
        except ValueError:
            return path
        return _resolve_under(self.host, PurePosixPath(relative.as_posix()))


def _read_chunks(handle: BinaryIO, limit: int) -> bytes:
    """Read in small chunks: procfs and sysfs refuse (ENOMEM) one huge read() count."""
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = handle.read(min(65536, remaining))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _resolve_under(root: Path, relative: PurePosixPath, depth: int = 0) -> Path:
    if depth > 40:
        raise OSError(f"too many levels of symbolic links under {root}")
    current = root
    parts = list(relative.parts)
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if not candidate.is_symlink():
            current = candidate
            continue
        target = PurePosixPath(os.readlink(candidate))
        base = PurePosixPath("/") if target.is_absolute() else PurePosixPath(
            "/", current.relative_to(root).as_posix())
        rest = PurePosixPath(*parts) if parts else PurePosixPath()
        joined = (base / target / rest).relative_to("/")
        return _resolve_under(root, joined, depth + 1)
    return current


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
            with self.roots.confine(path).open("rb", buffering=0) as handle:
                return _read_chunks(handle, limit)
        except (FileNotFoundError, NotADirectoryError):
            return None
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.gni-tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.mknod(tmp, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(tmp, mode)  # mknod's mode is filtered by the umask
        os.replace(tmp, path)

    def symlink(self, target: str, link: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        replace_symlink(link, target)

    def write_sysfs(self, path: Path, text: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write a file so that readers see the old content or the new, never a part.

    The bytes go to an adjacent temp file, are fsynced, then renamed over `path`; the
    directory is fsynced so the rename survives a power cut.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


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


def replace_symlink(link: Path, target: str) -> None:
    """Make `link` point at `target` with one atomic rename: readers see old or new."""
    tmp = link.with_name(f".{link.name}.new-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
