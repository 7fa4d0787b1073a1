"""Raw kernel calls through ctypes: finit_module(2), delete_module(2), renameat2(2).

glibc < 2.38 has no finit_module wrapper and the image must not depend on kmod, so the
syscall numbers per machine live here. Errors come back as OSError with the kernel's errno;
the load stage maps them to errors with remedies.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Any

from installer.errors import UnsupportedNodeError

# finit_module / delete_module numbers per machine.
SYSCALLS: dict[str, tuple[int, int]] = {"x86_64": (313, 176), "aarch64": (273, 106)}
MODULE_INIT_COMPRESSED_FILE = 4


def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in SYSCALLS:
        raise UnsupportedNodeError(f"loading modules on {machine} is not supported",
                                   remedy="run on an x86_64 or aarch64 node")
    return SYSCALLS[machine]


def _syscall(number: int, *args: Any) -> None:
    """Make a raw syscall; raise OSError carrying the kernel's errno when it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def finit_module(fd: int, params: str, flags: int = 0) -> None:
    """finit_module(fd, params, flags): the kernel reads the module from the open file."""
    _syscall(_syscall_numbers()[0], ctypes.c_int(fd), ctypes.c_char_p(params.encode()),
             ctypes.c_int(flags))


def delete_module(name: str) -> None:
    """delete_module(name, O_NONBLOCK): fail at once (EAGAIN) instead of waiting for users."""
    _syscall(_syscall_numbers()[1], ctypes.c_char_p(name.encode()),
             ctypes.c_uint(os.O_NONBLOCK))


RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two existing names in one atomic step.

    False where the kernel, libc or filesystem cannot (ENOSYS, EINVAL, no wrapper in libc):
    the caller then falls back to two renames. Other failures raise OSError.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "renameat2", None)
    if call is None:
        return False
    done = call(ctypes.c_int(_AT_FDCWD), os.fsencode(first), ctypes.c_int(_AT_FDCWD),
                os.fsencode(second), ctypes.c_uint(RENAME_EXCHANGE))
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(first))
