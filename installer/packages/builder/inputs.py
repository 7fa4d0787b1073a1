"""The inputs of `package build`: .deb files, extracted trees, .run archives, kernel modules.

Debian's and Ubuntu's NVIDIA packages (`.deb` files, read by `debfile` whichever compression
dpkg gave them, or a tree they were extracted into), NVIDIA's
`.run` installer (a makeself archive, unpacked without running its header: `makeself`), and a
directory of kernel modules built for one kernel (dependencies read from each `.modinfo`).
User-mode files are picked by what they are (ELF libraries and `nvidia-*` executables of
the package's arch, firmware under `firmware/`); modules are put in load order from the
dependencies their `.modinfo` declares. `installer.packages.builder` writes the package.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from installer.errors import ConfigError
from installer.node import arches, elf, kmod
from installer.packages import makeself
from installer.packages.builder import debfile
from installer.packages.manifest import LinkEntry

MODULE_ORDER = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
OPTIONAL_MODULES = ("nvidia_peermem",)  # shipped, not listed: RDMA decides (load/rdma.py)
OPEN_LICENSES = ("Dual MIT/GPL", "GPL", "Dual BSD/GPL")
# in a .run but not part of a node's driver: the installer itself and the X11/GUI tools
NOT_SHIPPED = ("nvidia-installer", "nvidia-uninstall", "nvidia-settings", "nvidia-xconfig")
KIND_MODES = {"library": 0o644, "binary": 0o755, "module": 0o644, "firmware": 0o644,
              "config": 0o644, "source": 0o644}
COPY_CHUNK = 1024 * 1024
_RUNFILE_ARCH_RE = re.compile(r"^NVIDIA-Linux-(?P<arch>[a-z0-9_]+)-\d")


class PackageBuildError(ConfigError):
    """The inputs cannot be made into a package (exit 2: fix the command's inputs)."""

    default_remedy = "check the inputs given to `package build` (see its --help)"


@dataclass(frozen=True)
class Picked:
    """A file chosen for the package: its package path, where it is now, its kind."""

    relpath: str
    source: Path
    kind: str


@dataclass(frozen=True)
class ModuleInfo:
    """What a module's `.modinfo` says about it."""

    name: str
    path: Path
    depends: tuple[str, ...]
    kernel_release: str | None
    version: str | None
    license: str | None
    arch: str | None = None


def _fail(message: str, remedy: str | None = None) -> PackageBuildError:
    return PackageBuildError(message, remedy=remedy)


# ---------------------------------------------------------------- inputs


def extract_deb(deb: Path, dest: Path, *, skip_outside_links: bool = False) -> None:
    """Unpack a .deb's data archive (ar + tar) without dpkg; unsafe members are refused.

    `skip_outside_links` leaves out links that point outside `dest` (a headers package's
    `/lib/modules/<release>/build` link) instead of refusing the package.
    """
    try:
        debfile.unpack(deb, dest, skip_outside_links=skip_outside_links)
    except debfile.DebFileError as exc:
        raise _fail(exc.message, remedy=exc.remedy) from None


def deb_control(deb: Path) -> dict[str, str]:
    """The fields of a .deb's `control` file (Package, Version, Architecture, ...)."""
    try:
        return debfile.control(deb)
    except debfile.DebFileError as exc:
        raise _fail(exc.message, remedy=exc.remedy) from None


def extract_run(run_file: Path, dest: Path) -> None:
    """Unpack NVIDIA's .run payload without running its shell header (`makeself`)."""
    if not run_file.is_file():
        raise _fail(f"{run_file} does not exist")
    try:
        makeself.extract(run_file, dest)
    except makeself.RunfileError as exc:
        raise _fail(exc.message, remedy="pass NVIDIA's complete NVIDIA-Linux-<arch>-"
                    "<version>.run installer") from None


def input_arch(path: Path) -> str | None:
    """The arch a user-mode input says it is for: a .deb's `Architecture` (`all` says
    nothing), a runfile's name `NVIDIA-Linux-<arch>-<version>.run`; None when it does not say."""
    if path.suffix == ".deb":
        declared = deb_control(path).get("Architecture", "all")
        return None if declared == "all" else arches.canonical(declared) or declared
    match = _RUNFILE_ARCH_RE.match(path.name)
    return (arches.canonical(match["arch"]) or match["arch"]) if match else None


def check_input_arch(path: Path, arch: str) -> None:
    """Refuse an input made for another arch before it is unpacked (its files would all be
    skipped, and the build would end in a vaguer "no driver files")."""
    found = input_arch(path)
    if found is not None and found != arch:
        raise _fail(f"{path.name} is for {found}, not --arch {arch}",
                    remedy=f"pass --arch {found}, or the {arch} build of that input")


def elf_machine(path: Path) -> str | None:
    """The ELF's architecture (x86_64/aarch64), or None when not an ELF we know."""
    try:
        with path.open("rb") as handle:
            return elf.machine(handle.read(20))
    except OSError:
        return None


def classify(path: Path, relative: Path, arch: str) -> str | None:
    """The kind of a user-mode file of a driver tree, or None when it is not shipped."""
    if path.is_symlink() or not path.is_file():
        return None
    if "firmware" in relative.parts[:-1] and path.suffix == ".bin":
        return "firmware"
    if elf_machine(path) != arch:
        return None
    if ".so" in path.name:
        return "library"
    if (path.name.startswith("nvidia-") and path.name not in NOT_SHIPPED
            and os.access(path, os.X_OK)):
        return "binary"
    return None


def pick_user_files(roots: list[Path], arch: str) -> tuple[list[Picked], list[LinkEntry]]:
    """Libraries, binaries and firmware of every tree, and the library links beside them."""
    picked: dict[str, Picked] = {}
    link_candidates: list[tuple[Path, str]] = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
            relative = path.relative_to(root)
            kind = classify(path, relative, arch)
            if kind is None:
                if path.is_symlink() and ".so" in path.name:
                    link_candidates.append((path, "lib64/" + path.name))
                continue
            relpath = _package_relpath(kind, relative)
            if relpath in picked and file_sha256(picked[relpath].source) != file_sha256(path):
                raise _fail(f"two different files would both be {relpath}: "
                            f"{picked[relpath].source} and {path}")
            picked[relpath] = Picked(relpath, path, kind)
    return sorted(picked.values(), key=lambda p: p.relpath), _links(link_candidates, picked)


def _package_relpath(kind: str, relative: Path) -> str:
    if kind == "firmware":
        parts = relative.parts
        index = len(parts) - 1 - parts[::-1].index("firmware")
        return "/".join(("firmware", *parts[index + 1:]))
    return f"{'lib64' if kind == 'library' else 'bin'}/{relative.name}"


def _links(candidates: list[tuple[Path, str]], picked: dict[str, Picked]) -> list[LinkEntry]:
    """`lib64/libcuda.so.1 -> libcuda.so.535.x`: links whose chain ends at a picked library."""
    links: dict[str, LinkEntry] = {}
    for path, relpath in candidates:
        target = path.resolve()
        final = f"lib64/{target.name}"
        if final in picked and final != relpath and relpath not in picked:
            links[relpath] = LinkEntry(relpath, target.name)
    return [links[key] for key in sorted(links)]


def file_sha256(path: Path) -> str:
    """A file's sha256, read in chunks (inputs can be hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- kernel modules


def read_module(path: Path) -> ModuleInfo:
    """Name, dependencies, kernel release (vermagic), version and licence of one module."""
    data = _module_bytes(path)
    try:
        info = kmod.modinfo(data)
    except ValueError as exc:
        raise _fail(f"{path} is not a kernel module: {exc}") from None
    vermagic = (info.get("vermagic") or [""])[0].split()
    name = (info.get("name") or [kmod.module_name(path.name)])[0]
    return ModuleInfo(kmod.normalize(name), path, kmod.modinfo_depends(data),
                      vermagic[0] if vermagic else None,
                      _first(info, "version"), _first(info, "license"), elf.machine(data[:20]))


def _first(info: dict[str, list[str]], key: str) -> str | None:
    values = info.get(key)
    return values[0] if values else None


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        if path.name.endswith(".ko.xz"):
            import lzma

            return lzma.decompress(data)
        if path.name.endswith(".ko.gz"):
            import gzip

            return gzip.decompress(data)
        if path.name.endswith(".ko.zst"):
            import zstandard

            # every frame: `zstd -T` may write several
            with zstandard.ZstdDecompressor().stream_reader(
                    data, read_across_frames=True) as reader:
                return reader.read()
    except Exception as exc:  # lzma, zlib, gzip (OSError, EOFError) and zstd errors alike
        raise _fail(f"{path} cannot be decompressed ({debfile.one_line(exc)})",
                    remedy="give the module as the kernel's build wrote it") from None
    return data


def scan_modules(directory: Path) -> list[ModuleInfo]:
    """Every module file under a directory (recursively), as modinfo describes it."""
    if not directory.is_dir():
        raise _fail(f"modules directory {directory} does not exist")
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(
        (".ko", ".ko.xz", ".ko.gz", ".ko.zst")))
    if not files:
        raise _fail(f"{directory} holds no kernel modules (*.ko)")
    modules = [read_module(path) for path in files]
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise _fail(f"{directory} holds two modules of the same name")
    return modules


def load_order(modules: list[ModuleInfo]) -> list[ModuleInfo]:
    """Dependencies first; among ready modules NVIDIA's usual order, then by name."""
    by_name = {m.name: m for m in modules if m.name not in OPTIONAL_MODULES}
    rank = {name: i for i, name in enumerate(MODULE_ORDER)}
    ordered: list[ModuleInfo] = []
    pending = dict(by_name)
    while pending:
        ready = [m for m in pending.values()
                 if all(d not in pending for d in m.depends)]
        if not ready:
            raise _fail(f"modules {sorted(pending)} depend on each other in a cycle")
        chosen = min(ready, key=lambda m: (rank.get(m.name, len(rank)), m.name))
        ordered.append(chosen)
        del pending[chosen.name]
    return ordered
