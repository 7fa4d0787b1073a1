"""The raw kernel calls for modules: finit_module(2) and delete_module(2) through ctypes.

glibc < 2.38 has no finit_module wrapper and the image must not depend on kmod, so the
syscall numbers per machine live here. Errors come back as OSError with the kernel's errno;
the load stage maps them to errors with remedies.
"""

from __future__ import annotations

import ctypes
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
