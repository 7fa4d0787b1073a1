"""Library links and the linker cache: SONAME links from ELF, ld.so.conf.d, host ldconfig.

The dynamic linker looks for a library by its SONAME (`libcuda.so.1`), so each staged
library gets that link, read from the file's own dynamic section, plus the unversioned
`.so` link that build tools use. The host's linker cache learns the install dir through
one file in /etc/ld.so.conf.d, rewritten only when its content changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from installer.context import Context
from installer.errors import DiskFullError, IntegrityError
from installer.installdir.layout import LDCONF_NODE_PATH
from installer.node import arches
from installer.node.elf import ElfError, is_elf, read_soname
from installer.node.host import Host, replace_symlink, write_atomic

LDCONFIG_NODE_PATHS = ("/sbin/ldconfig", "/usr/sbin/ldconfig")


def make_soname_links(lib_dir: Path) -> None:
    """`libX.so.1 -> libX.so.<version>` from each ELF's SONAME, plus `libX.so` dev links."""
    for path in sorted(lib_dir.iterdir()):
        if path.is_symlink() or not path.is_file() or not is_elf(path):
            continue
        try:
            soname = read_soname(path)
        except ElfError as exc:
            raise IntegrityError(f"{path.name} is not a valid ELF library: {exc}") from exc
        if soname and soname != path.name and "/" not in soname:
            symlink(path.name, lib_dir / soname)
        stem = path.name.split(".so", 1)[0] + ".so"
        if ".so" in path.name and stem != path.name and not (lib_dir / stem).exists():
            symlink(soname or path.name, lib_dir / stem)


def symlink(target: str, link: Path) -> None:
    """Create or replace a link inside a version directory still being built."""
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def soname_links(lib_dir: Path) -> dict[str, str]:
    """The links of a staged lib64, for the stage result."""
    return {p.name: os.readlink(p) for p in sorted(lib_dir.iterdir()) if p.is_symlink()}


def refresh_linker(ctx: Context, *, files_changed: bool = True) -> list[str]:
    """Write the ld.so.conf.d entry (only when it changes) and rerun the host's ldconfig.

    ldconfig runs only when the entry or the staged libraries changed: on the reboot fast
    path it would be the slowest step, and the host's cache is still right.
    """
    host = ctx.host
    conf = host.roots.node_entry(LDCONF_NODE_PATH)  # a link there is replaced
    text = (f"# gpu-node-installer: the NVIDIA user-mode driver; rewritten on each install\n"
            f"{ctx.config.install_dir}/lib64\n")
    warnings = []
    try:
        if host.read_text(conf) != text:
            write_atomic(conf, text.encode())
            files_changed = True
    except (OSError, DiskFullError) as exc:  # the host's /etc: a warning, not a failure
        warnings.append(f"cannot write {LDCONF_NODE_PATH}: {exc}")
    ldconfig = _host_ldconfig(host) if files_changed else None
    if ldconfig:
        done = host.run(["chroot", str(host.roots.host), ldconfig])
        if done.returncode != 0:
            warnings.append(f"ldconfig on the host failed ({done.returncode}): "
                            f"{done.stderr.strip()[:200]}")
    for warning in warnings:
        ctx.log.warning("linker cache not refreshed", detail=warning)
    return warnings


def _host_ldconfig(host: Host) -> str | None:
    for node_path in LDCONFIG_NODE_PATHS:
        if host.roots.confine(host.roots.node(node_path)).is_file():
            return node_path
    return None


def driver_root_layout(root: Path, arch: str) -> None:
    """usr/lib/<multiarch> and usr/lib64 -> lib64, usr/bin -> bin (gpu-operator consumers)."""
    multiarch = arches.multiarch(arch)
    (root / "usr" / "lib").mkdir(parents=True, exist_ok=True)
    for link, target in ((f"usr/lib/{multiarch}", "../../lib64"), ("usr/lib64", "../lib64"),
                         ("usr/bin", "../bin")):
        path = root / link
        if not (path.is_symlink() and os.readlink(path) == target):
            replace_symlink(path, target)
