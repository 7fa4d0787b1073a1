"""The kernels installed on the node, as the files say: modules trees, boot links and the
distribution's reboot-required marker. Read only, confined to the host root.

A kernel counts as installed when `/lib/modules/<release>` is a real directory (not a
link) holding both its modules (`kernel/`, what the kernel package unpacks) and a regular
`modules.dep` (what the package's postinst writes with depmod, last): a tree with only one
of them is a package still unpacking or the leftovers of a removed kernel (Debian's postrm
deletes `modules.*`, DKMS leaves `updates/`), and neither boots. The boot loader's default
image is what Debian's `/vmlinuz` and Ubuntu's `/boot/vmlinuz` links name: a target that
is not `/boot/vmlinuz-<release>` (once resolved against the link's directory) is refused,
never followed. Names are kernel releases as `uname -r` prints them (at most 64 bytes,
`__NEW_UTS_LEN`); anything else is refused with the reason, for the caller to log once.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.node.confine import EscapeError
from installer.node.host import Host

MODULES_DIR = PurePosixPath("/lib/modules")
BOOT_LINKS = (PurePosixPath("/vmlinuz"), PurePosixPath("/boot/vmlinuz"))
REBOOT_REQUIRED = PurePosixPath("/var/run/reboot-required")
REBOOT_PKGS = PurePosixPath("/var/run/reboot-required.pkgs")
MAX_TREES = 256  # a node keeps a handful of kernels; past this, the rest is not looked at
MAX_PKGS = 16 * 1024
RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}")  # `uname -r`: __NEW_UTS_LEN 64


@dataclass(frozen=True)
class Found:
    """One candidate: a release and where it was seen (`modules`, `/vmlinuz`, ...)."""

    release: str
    source: str


@dataclass(frozen=True)
class Refused:
    """An entry that is not taken as a kernel: what it is, and why (logged once)."""

    what: str
    why: str


@dataclass(frozen=True)
class Installed:
    """What one look at the node found."""

    trees: tuple[Found, ...] = ()  # complete modules trees
    defaults: tuple[Found, ...] = ()  # the boot links' releases, in BOOT_LINKS order
    incomplete: tuple[str, ...] = ()  # trees with a valid name, not (yet) complete
    refused: tuple[Refused, ...] = ()
    reboot_required: bool = False
    reboot_packages: tuple[str, ...] = ()  # /var/run/reboot-required.pkgs, first lines


def valid_release(name: str) -> bool:
    """Whether `name` can be a kernel release (no `/`, no `..`, printable, <= 64 bytes)."""
    return RELEASE.fullmatch(name) is not None and ".." not in name


def running_release(host: Host) -> str | None:
    """The running kernel's release (the node's /proc), None when unreadable or odd."""
    text = host.read_text(host.roots.proc / "sys" / "kernel" / "osrelease")
    release = (text or "").strip()
    return release if valid_release(release) else None


def modules_dir(host: Host) -> Path | None:
    """`/lib/modules` here (a usrmerge `/lib -> usr/lib` resolved on the node), or None."""
    try:
        return host.roots.node(MODULES_DIR)
    except EscapeError:
        return None


def look(host: Host) -> Installed:
    """The modules trees, the boot links and the reboot marker, as they are now."""
    trees, incomplete, refused = _trees(host)
    defaults: list[Found] = []
    for link in BOOT_LINKS:
        found = boot_default(host, link)
        if isinstance(found, Refused):
            refused.append(found)
        elif found is not None:
            defaults.append(found)
    marker = _exists(host, REBOOT_REQUIRED)
    return Installed(tuple(trees), tuple(defaults), tuple(incomplete), tuple(refused),
                     marker, _reboot_packages(host) if marker else ())


def _trees(host: Host) -> tuple[list[Found], list[str], list[Refused]]:
    trees: list[Found] = []
    incomplete: list[str] = []
    refused: list[Refused] = []
    top = modules_dir(host)
    if top is None:
        return trees, incomplete, [Refused(str(MODULES_DIR), "lies outside the host root")]
    try:
        with os.scandir(top) as entries:
            names = sorted(e.name for _, e in zip(range(MAX_TREES), entries, strict=False))
    except OSError:
        return trees, incomplete, refused
    for name in names:
        what = f"{MODULES_DIR}/{name[:80]}"
        if not valid_release(name):
            refused.append(Refused(what, "is no kernel release name"))
            continue
        kind = _kind(top / name)
        if kind != "a directory":
            refused.append(Refused(what, f"is {kind}, not a modules tree"))
        elif _is(top / name / "kernel", stat.S_ISDIR) and \
                _is(top / name / "modules.dep", stat.S_ISREG):
            trees.append(Found(name, "modules"))
        else:
            incomplete.append(name)
    return trees, incomplete, refused


def boot_default(host: Host, link: PurePosixPath) -> Found | Refused | None:
    """The release a boot link names; None when there is no such link."""
    try:
        path = host.roots.node_entry(link)
    except EscapeError:
        return None
    if not _is(path, stat.S_ISLNK):
        return None
    target = host.readlink(path)
    if target is None:
        return None
    resolved = posixpath.normpath(posixpath.join(str(link.parent), target))
    directory, _, name = resolved.rpartition("/")
    release = name.removeprefix("vmlinuz-")
    if directory != "/boot" or not name.startswith("vmlinuz-") or not valid_release(release):
        return Refused(str(link), f"points at {target[:120]!r}, not /boot/vmlinuz-<release>")
    return Found(release, str(link))


def _reboot_packages(host: Host) -> tuple[str, ...]:
    try:
        data = host.read_bytes(host.roots.node(REBOOT_PKGS), MAX_PKGS)
    except (OSError, EscapeError):
        return ()
    lines = (data or b"").decode(errors="replace").splitlines()
    return tuple(line.strip()[:80] for line in lines[:16] if line.strip())


def _exists(host: Host, node_path: PurePosixPath) -> bool:
    try:
        return host.roots.node(node_path).exists()
    except (OSError, EscapeError):
        return False


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "gone"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(mode) else "not a directory"


def _is(path: Path, test: Callable[[int], bool]) -> bool:
    """lstat `path` (never following it) and apply `test` (stat.S_ISDIR, ...) to its mode."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return test(mode)
