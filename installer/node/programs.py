"""A daemon's program, opened inside the host root and hashed from that very descriptor;
and what `/proc` says about a process (its start time, the file it runs).

The staged binary is opened once per start: its directory by openat2(RESOLVE_IN_ROOT)
(`confine.open_dir`), the file itself without following a link (a binary replaced by a
link, absolute or not, is refused by name), regular files only, non-blocking. The
descriptor is hashed against the sha256 the stage recorded and the process is exec'd
through `/proc/self/fd/N` of that descriptor, never through the path: what was hashed is
the inode that runs. A rewrite in place after the hash shows in the file's change time,
checked again once the exec is done (`unchanged`); a writer still holding the file open
makes the exec itself fail (ETXTBSY).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from installer.node import confine, files
from installer.node.files import NotRegularFile, read_capped
from installer.node.host import Host

OWN_PROC = Path("/proc")  # the procfs of the pid namespace the daemons run in
MAX_PROGRAM = 1 << 30  # no daemon binary is near 1 GiB; a bigger (sparse) file is refused
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY



class ProgramError(Exception):
    """The program cannot be started. `refused`: it is there but is not the staged file
    (hash, kind, link); otherwise it is missing or unreadable."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class Program:
    """An open, verified program: the descriptor to exec, its identity and its stamp."""

    path: Path
    fd: int
    sha256: str
    dev: int
    ino: int
    stamp: tuple[int, int, int]  # size, mtime_ns, ctime_ns when it was hashed

    @property
    def exec_path(self) -> str:
        """What to exec (in a child given `fd`): the descriptor, not the path."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        os.close(self.fd)


def kind_of(mode: int) -> str:
    """What a file of this mode (from lstat too) is, as a refusal names it."""
    return "a symbolic link" if stat.S_ISLNK(mode) else files.kind_of(mode)


def open_program(host: Host, path: Path, sha256: str | None) -> Program:
    """Open `path` (under the host root) confined, check it is a regular file whose sha256
    is `sha256`; ProgramError otherwise (`refused` unless it is simply missing)."""
    if sha256 is None:
        raise ProgramError(f"no sha256 is recorded for {path} (staged by an older "
                           "installer): not started", refused=True)
    fd = _open(host, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProgramError(f"{path} is {kind_of(info.st_mode)}, not the staged program",
                               refused=True)
        if info.st_size > MAX_PROGRAM:
            raise ProgramError(f"{path} is {info.st_size} bytes, more than any daemon",
                               refused=True)
        found = _hash(fd)
        if found != sha256:
            raise ProgramError(f"{path} has sha256 {found[:16]}..., not the {sha256[:16]}... "
                               "the package staged (changed since it was staged)",
                               refused=True)
        return Program(path, fd, found, info.st_dev, info.st_ino, _stamp(info))
    except BaseException:
        os.close(fd)
        raise


def unchanged(program: Program) -> bool:
    """Whether the file is still as it was when hashed (no write since: same change time)."""
    try:
        return _stamp(os.fstat(program.fd)) == program.stamp
    except OSError:
        return False


def _open(host: Host, path: Path) -> int:
    if not path.is_relative_to(host.roots.host):
        raise ProgramError(f"{path} lies outside the host root", refused=True)
    try:
        entry = host.roots.entry(path)  # the parent resolved as the node would
    except confine.EscapeError as exc:
        raise ProgramError(exc.message, refused=True) from None
    try:
        dirfd = confine.open_dir(entry.parent)  # again, in the kernel, at this instant
        try:
            return os.open(entry.name if dirfd is not None else entry, _OPEN, dir_fd=dirfd)
        finally:
            if dirfd is not None:
                os.close(dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProgramError(f"{path} is a symbolic link, not the staged program",
                               refused=True) from None
        raise ProgramError(f"cannot start {path}: {exc.strerror}", refused=False) from None


def _hash(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _stamp(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat from field 3 (the state) on; empty when the process is gone."""
    try:
        raw = (OWN_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return []
    return raw[raw.rfind(b")") + 2:].split()  # the name may hold spaces and ")"


def start_ticks(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (field 22 of /proc/PID/stat): with
    the pid, one process for the life of the boot. None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def gone(pid: int) -> bool:
    """Whether the process has exited (no such pid, or a zombie not reaped yet)."""
    fields = _stat_fields(pid)
    return not fields or fields[0] in (b"Z", b"X")


def started_monotonic(ticks: int | None) -> float:
    """A process's start time from /proc (clock ticks since boot) on time.monotonic()'s
    clock (both count from boot); now when it is unknown."""
    now = time.monotonic()
    if ticks is None:
        return now
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return now - max(0.0, since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def exe_identity(pid: int) -> tuple[int, int] | None:
    """(device, inode) of the file a process runs (/proc/PID/exe); None when it is gone,
    a zombie, a kernel thread or not ours to look at."""
    try:
        info = os.stat(OWN_PROC / str(pid) / "exe")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def boot_id() -> str:
    """This boot's id: a record from an earlier boot names no process of this one."""
    try:
        return (OWN_PROC / "sys/kernel/random/boot_id").read_text()[:64].strip()
    except OSError:
        return ""


def read_small(path: Path, limit: int) -> bytes | None:
    """Up to `limit` bytes of a regular file, None when absent; OSError naming the kind of
    anything else (installer.node.files: a FIFO planted there is never waited on)."""
    try:
        return read_capped(path, limit)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise OSError(errno.EINVAL, f"{path} is {exc.strerror}, not a regular file") from None
