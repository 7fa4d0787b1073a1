"""Confinement: map a path on the node to its real path under the host root, for writes too.

The node's `/` is mounted at the host root; a symlink on the node (`/home/kubernetes ->
/mnt/stateful/home`, or a relative one) means what it means on the node. Resolved naively
here it would point into this container's own filesystem, so every path the installer
writes, renames or deletes is resolved the way the node resolves it: absolute link targets
re-rooted at the host root, `..` clamped there. `openat2(2)` with `RESOLVE_IN_ROOT` does it
in the kernel where it exists (Linux 5.6+); otherwise, and for the part of a path that does
not exist yet, a walk component by component does the same.

A path resolved here is still a path: a link swapped into it on the node before the write
would redirect a path-based write. `open_dir` closes that gap for the writes that matter (the
install dir's switch, the cache's rename, `node.host`): the directory is opened by
openat2(RESOLVE_IN_ROOT) at the instant of the write and the write goes through that
descriptor (`*at()`), so it lands inside the host root or fails, never outside.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path, PurePosixPath

from installer.errors import UnsupportedNodeError

MAX_LINKS = 40  # the kernel's own limit (ELOOP)
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10


class EscapeError(UnsupportedNodeError):
    """A path on the node cannot be confined to the host root."""

    default_remedy = ("check the symbolic links on the node's path; the installer writes "
                      "only inside --host-root")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None
_ROOT_FDS: dict[Path, int] = {}
_HOST_ROOTS: dict[str, Path] = {}  # the host roots this process confines to
_openat2_works = _SYS_OPENAT2 is not None


def resolve(root: Path, relative: PurePosixPath, *, follow_last: bool = True) -> Path:
    """The real path here of `relative` (a path on the node, relative to its `/`).

    With `follow_last=False` the last component is kept as it is (a link we replace or
    delete, never the file it points at). Raises EscapeError when the result would lie
    outside the host root or the host root is not a directory.
    """
    _remember(root)
    parts = [p for p in relative.parts if p not in ("", ".", "/")]
    if not follow_last and parts and parts[-1] != "..":
        parent = resolve(root, PurePosixPath(*parts[:-1]), follow_last=True)
        return _inside(root, parent / parts[-1])
    found = _kernel_resolve(root, parts) if parts else None
    if found is None:
        found = _walk(root, parts)
    return _inside(root, found)


def _inside(root: Path, path: Path) -> Path:
    top, text = str(root).rstrip("/"), str(path)
    if text != top and not text.startswith(top + "/"):
        raise EscapeError(f"{path} lies outside the host root {root}")
    return path


def check_root(root: Path) -> None:
    """The host root must be a real directory: every confined path hangs from it."""
    if not root.is_dir():
        raise EscapeError(f"the host root {root} is not a directory",
                          remedy="mount the node's / there or pass --host-root")


def _remember(root: Path) -> None:
    key = str(root).rstrip("/") or "/"
    if key not in _HOST_ROOTS:
        if len(_HOST_ROOTS) >= 8:  # a process has one host root; tests make many
            _HOST_ROOTS.pop(next(iter(_HOST_ROOTS)))
        _HOST_ROOTS[key] = root


def _root_fd(root: Path) -> int:
    """The host root's descriptor, kept open; opened again when the root was replaced."""
    dirfd = _ROOT_FDS.get(root)
    if dirfd is not None and not _same_dir(dirfd, root):
        os.close(_ROOT_FDS.pop(root))
        dirfd = None
    if dirfd is None:
        try:
            dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            check_root(root)
            raise
        if len(_ROOT_FDS) >= 8:
            os.close(_ROOT_FDS.pop(next(iter(_ROOT_FDS))))
        _ROOT_FDS[root] = dirfd  # kept open: one open per host root, not per path
    return dirfd


def _same_dir(dirfd: int, root: Path) -> bool:
    try:
        now, held = os.stat(root), os.fstat(dirfd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _unavailable(err: int) -> bool:
    """Whether openat2 failed for want of the call itself (old kernel, seccomp)."""
    global _openat2_works
    if err in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
        _openat2_works = False  # walk, and write by path, from now on
    return not _openat2_works


def kernel_confines() -> bool:
    """Whether openat2(RESOLVE_IN_ROOT) works here (False after ENOSYS and the like)."""
    return _openat2_works


def open_dir(path: Path) -> int | None:
    """An O_PATH descriptor of the directory `path` (a path under a host root this process
    confines to), resolved again at this instant by openat2(RESOLVE_IN_ROOT): a link swapped
    into the path since leads inside the root or nowhere. None when `path` is under no known
    host root or openat2 is unavailable (the caller then writes by path); OSError (ENOENT,
    ENOTDIR) when the directory is not there inside the root any more."""
    text = str(path)
    keys = [k for k in _HOST_ROOTS if text == k or text.startswith(k.rstrip("/") + "/")]
    if not keys or not _openat2_works:
        return None
    key = max(keys, key=len)
    fd = _openat2(_root_fd(_HOST_ROOTS[key]), (text[len(key):].strip("/") or ".").encode(),
                  os.O_DIRECTORY)
    if fd >= 0:
        return fd
    if _unavailable(-fd):
        return None
    raise OSError(-fd, os.strerror(-fd), text)


def _kernel_resolve(root: Path, parts: list[str]) -> Path | None:
    """openat2(RESOLVE_IN_ROOT) + the fd's path; None when unavailable or a part is missing."""
    global _openat2_works
    if not _openat2_works:
        return None
    fd = _openat2(_root_fd(root), "/".join(parts).encode())
    if fd < 0:
        _unavailable(-fd)
        return None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        _openat2_works = False
        return None
    finally:
        os.close(fd)
    if real.endswith(" (deleted)"):
        return None
    return _rebase(root, Path(real))


_REAL_ROOTS: dict[Path, Path] = {}


def _rebase(root: Path, real: Path) -> Path:
    """The kernel names the result by real path; express it under `root` as given (the
    host root may itself be reached through a link in this container)."""
    real_root = _REAL_ROOTS.get(root)
    if real_root is None:
        real_root = _REAL_ROOTS.setdefault(root, Path(os.path.realpath(root)))
    if real == real_root:
        return root
    try:
        return root / real.relative_to(real_root)
    except ValueError:
        raise EscapeError(f"{real} lies outside the host root {root}") from None


def _openat2(dirfd: int, path: bytes, flags: int = 0) -> int:
    """The raw syscall (O_PATH, plus `flags`): a file descriptor, or minus the errno."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC | flags, 0,
                   _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    fd = int(_libc.syscall(ctypes.c_long(_SYS_OPENAT2 or -1), ctypes.c_int(dirfd),
                           ctypes.c_char_p(path), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how))))
    return fd if fd >= 0 else -ctypes.get_errno()


def _walk(root: Path, parts: list[str]) -> Path:
    """Component by component: what RESOLVE_IN_ROOT does, also through missing parts
    (a dangling link's target is followed, so a directory created later lands inside)."""
    check_root(root)
    current, pending, links = root, list(parts), 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or missing: a plain name
            current = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            raise EscapeError(f"too many levels of symbolic links at {candidate}")
        if target.startswith("/"):
            current = root
        pending[:0] = PurePosixPath(target).parts[1 if target.startswith("/") else 0:]
    return current
