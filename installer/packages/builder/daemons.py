"""`package build --fabricmanager/--nvlsm/--persistenced/--imex`: the driver's daemons as inputs.

Each input is one of NVIDIA's archives (`fabricmanager-linux-x86_64-<version>-archive.tar.xz`,
`nvlsm-linux-<arch>-<version>-archive.tar.xz`), a Debian package (Debian's own
`nvidia-persistenced`, NVIDIA's `nvidia-fabricmanager-<branch>`), or the plain executable.
Nothing of an input is ever run: the version comes from the archive's name, the package's
`Version` (upstream part; NVIDIA's `nvidia-imex` .deb is versioned with the driver), or,
for a plain executable, the version string it carries
(`nvidia-persistenced:  version 535.171.04`). From the unpacked input only what the daemon
needs is taken: its executable (ELF of the package's arch), its config and Fabric Manager's
topology files, NVLSM's plugin libraries; they become ordinary package files, and the
manifest's `daemons` names them (installer.packages.daemons).
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.packages.builder.inputs import (
    PackageBuildError,
    Picked,
    deb_control,
    elf_machine,
    extract_deb,
    file_sha256,
)
from installer.packages.daemons import (
    CONFIG_NAMES,
    DRIVER_VERSIONED,
    FABRIC_MANAGER,
    IMEX,
    NVLSM,
    PERSISTENCED,
    VERSION_RE,
    DaemonEntry,
)

FLAGS = {FABRIC_MANAGER: "--fabricmanager", NVLSM: "--nvlsm", PERSISTENCED: "--persistenced",
         IMEX: "--imex"}
_WHAT = {FABRIC_MANAGER: "Fabric Manager", IMEX: "nvidia-imex"}
_IMEX_CONFIG = "config.cfg"  # /etc/nvidia-imex/config.cfg in NVIDIA's package
_IMEX_TOOLS = ("nvidia-imex-ctl",)  # the state query tool beside the service
_ARCHIVE_NAMES = {FABRIC_MANAGER: "fabricmanager", NVLSM: "nvlsm"}
_PLATFORMS = {"x86_64": "x86_64", "sbsa": "aarch64", "aarch64": "aarch64"}
_ARCHIVE_RE = re.compile(r"^(?P<component>[a-z]+)-linux-(?P<platform>x86_64|sbsa|aarch64)-"
                         r"(?P<version>[0-9][0-9A-Za-z.+~]*)-archive$")
_TAR_SUFFIXES = (".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar")
_EMBEDDED_RE = re.compile(rb"version\s*(?:is\s*)?:?\s*([0-9]+\.[0-9][0-9.]*[0-9])")
MAX_BINARY_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class DaemonInput:
    """A daemon read from its input: version, where it came from, the files it brings."""

    name: str
    version: str
    source: Path
    picked: tuple[Picked, ...]

    def entry(self) -> DaemonEntry:
        return DaemonEntry(self.name, self.version, tuple(p.relpath for p in self.picked))


def _fail(message: str, remedy: str | None = None) -> PackageBuildError:
    return PackageBuildError(message, remedy=remedy)


def read_daemon(name: str, source: Path, work: Path, arch: str) -> DaemonInput:
    """Unpack (never run) one daemon input into `work` and pick the daemon's files."""
    flag = FLAGS[name]
    try:
        with source.open("rb") as handle:
            magic = handle.read(8)
    except OSError as exc:
        raise _fail(f"{flag} {source}: cannot read it ({exc.strerror or exc})") from None
    if magic == b"!<arch>\n":
        version = _deb_version(source, flag)
        extract_deb(source, work)
        return DaemonInput(name, version, source, _pick(name, work, arch, f"{flag} {source}"))
    if magic[:4] == b"\x7fELF":
        return DaemonInput(name, _embedded_version(source, flag), source,
                           (_binary(name, source, arch, flag),))
    if source.name.endswith(_TAR_SUFFIXES) or tarfile.is_tarfile(source):
        version = _unpack_archive(name, source, work, arch, flag)
        return DaemonInput(name, version, source, _pick(name, work, arch, f"{flag} {source}"))
    raise _fail(f"{flag} {source} is neither NVIDIA's archive, a .deb nor an executable",
                remedy=f"give {name} as NVIDIA's .tar.xz archive, a .deb or the executable")


def check_versions(daemons: list[DaemonInput], driver_version: str) -> None:
    """NVIDIA requires Fabric Manager and IMEX of exactly the driver's version (IMEX aborts
    on another loaded driver): refuse any other."""
    for daemon in daemons:
        if daemon.name in DRIVER_VERSIONED and daemon.version != driver_version:
            what = _WHAT[daemon.name]
            raise _fail(f"{FLAGS[daemon.name]} {daemon.source} is {what} {daemon.version}, "
                        f"but the driver is {driver_version}; NVIDIA requires the same "
                        "version", remedy=f"give {what} {driver_version} ("
                        + (f"fabricmanager-linux-<arch>-{driver_version}-archive.tar.xz)"
                           if daemon.name == FABRIC_MANAGER else
                           f"NVIDIA's nvidia-imex .deb of version {driver_version})"))


def merge(picked: list[Picked], daemons: list[DaemonInput]) -> list[Picked]:
    """The user-mode files plus the daemons' files; a daemon's executable replaces a tool
    of the same name (the .run's own nvidia-persistenced), other clashes are refused."""
    merged = {item.relpath: item for item in picked}
    for daemon in daemons:
        for item in daemon.picked:
            other = merged.get(item.relpath)
            if (other is not None and item.relpath != f"bin/{daemon.name}"
                    and file_sha256(other.source) != file_sha256(item.source)):
                raise _fail(f"two different files would both be {item.relpath}: "
                            f"{other.source} and {item.source}")
            merged[item.relpath] = item
    return sorted(merged.values(), key=lambda p: p.relpath)


# ---------------------------------------------------------------- versions


def _deb_version(deb: Path, flag: str) -> str:
    """The upstream part of the package's Version (`1:535.171.04-1~deb12u1` -> 535.171.04)."""
    full = deb_control(deb).get("Version", "")
    upstream = full.split(":", 1)[-1]  # without the epoch
    if "-" in upstream:  # and without the Debian revision
        upstream = upstream.rsplit("-", 1)[0]
    if not VERSION_RE.match(upstream):
        raise _fail(f"{flag} {deb}: its Version {full!r} has no upstream version")
    return upstream


def _embedded_version(binary: Path, flag: str) -> str:
    """The version string an executable carries (read as bytes, never run)."""
    if binary.stat().st_size > MAX_BINARY_BYTES:
        raise _fail(f"{flag} {binary} is larger than {MAX_BINARY_BYTES} bytes")
    found: set[str] = {m.decode() for m in _EMBEDDED_RE.findall(binary.read_bytes())}
    if len(found) != 1:
        raise _fail(f"cannot tell the version of {flag} {binary} from the file ("
                    + (f"it names {', '.join(sorted(found))}" if found else
                       "it names none") + ")",
                    remedy="give NVIDIA's archive or the .deb, which carry the version")
    return found.pop()


def _archive_name(source: Path, top: str | None) -> re.Match[str] | None:
    """NVIDIA's `<component>-linux-<platform>-<version>-archive`: the archive's top
    directory, else its file name."""
    stem = source.name
    for suffix in _TAR_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return ((_ARCHIVE_RE.match(top) if top else None) or _ARCHIVE_RE.match(stem))


def _unpack_archive(name: str, source: Path, work: Path, arch: str, flag: str) -> str:
    try:
        with tarfile.open(source) as archive:
            tops = {PurePosixPath(m.name).parts[0] for m in archive.getmembers()
                    if PurePosixPath(m.name).parts}
            archive.extractall(work, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _fail(f"{flag} {source}: cannot unpack it ({exc})") from None
    match = _archive_name(source, tops.pop() if len(tops) == 1 else None)
    if match is None:
        raise _fail(f"cannot tell the version of {flag} {source} from its name",
                    remedy=f"give NVIDIA's archive as published ({_ARCHIVE_NAMES.get(name, name)}"
                           "-linux-<arch>-<version>-archive.tar.xz)")
    if match["component"] != _ARCHIVE_NAMES.get(name):
        raise _fail(f"{flag} {source} is NVIDIA's {match['component']} archive, not "
                    f"{_ARCHIVE_NAMES.get(name, name)}'s")
    if _PLATFORMS[match["platform"]] != arch:
        raise _fail(f"{flag} {source} is for {match['platform']}, not {arch}",
                    remedy="give the archive for --arch, or pass another --arch")
    return str(match["version"])


# ---------------------------------------------------------------- files


def _is_config(name: str) -> Callable[[PurePosixPath], bool]:
    if name == FABRIC_MANAGER:  # its config, and the topology files it reads beside it
        return lambda rel: rel.name == CONFIG_NAMES[name] or rel.name.endswith("_topology")
    if name == NVLSM:  # nvlsm.conf and the plugin configs it names (share/nvidia/nvlsm/)
        return lambda rel: rel.suffix == ".conf" and "nvlsm" in rel.parts[:-1]
    if name == IMEX:  # etc/nvidia-imex/config.cfg (nodes_config.cfg is the site's own)
        return lambda rel: rel.name == _IMEX_CONFIG and "nvidia-imex" in rel.parts[:-1]
    return lambda rel: False


def _binary(name: str, path: Path, arch: str, flag: str) -> Picked:
    machine = elf_machine(path)
    if machine != arch:
        raise _fail(f"{flag} {path} is not an executable for {arch} (it is "
                    f"{machine or 'no ELF we know'})", remedy="give the daemon for --arch")
    return Picked(f"bin/{name}", path, "binary")


def _pick(name: str, root: Path, arch: str, what: str) -> tuple[Picked, ...]:
    """The daemon's executable, configs and (NVLSM) plugin libraries from an unpacked input."""
    is_config = _is_config(name)
    chosen: dict[str, Picked] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if path.name == name and elf_machine(path) == arch:
            item = Picked(f"bin/{name}", path, "binary")
        elif name == IMEX and path.name in _IMEX_TOOLS and elf_machine(path) == arch:
            item = Picked(f"bin/{path.name}", path, "binary")
        elif is_config(rel):
            item = Picked(f"etc/{CONFIG_NAMES[IMEX] if name == IMEX else path.name}", path,
                          "config")
        elif name == NVLSM and ".so" in path.name and elf_machine(path) == arch:
            item = Picked(f"lib64/{path.name}", path, "library")
        else:
            continue
        first = chosen.setdefault(item.relpath, item)
        if first is not item and file_sha256(first.source) != file_sha256(path):
            raise _fail(f"{what} holds two different {item.relpath.split('/')[-1]} files "
                        f"({rel} and another)")
    if f"bin/{name}" not in chosen:
        raise _fail(f"{what} holds no {arch} executable named {name}",
                    remedy=f"give the {name} input for --arch")
    return tuple(chosen[key] for key in sorted(chosen))
