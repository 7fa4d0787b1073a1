"""`kernel-devel` RPMs as `--kernel-headers` (RHEL, Rocky, Amazon Linux 2023).

RHEL-family kernels ship their build tree in one package, `kernel-devel-<release>`, laid
out at `/usr/src/kernels/<release>/` (`.config`, `include/generated/utsrelease.h`, the full
`Makefile`, `scripts/` with its tools built): no -common or kbuild companions as Debian's.

The package's name, version, release and arch come from its header, read here (the lead,
then the signature and main headers: rpm's `lib/header.c` format, bounded as rpm bounds
it). Its payload (a cpio archive, gzip, xz, zstd or bzip2 compressed) is turned into a tar
by rpm's own `rpm2archive` (Debian package `rpm2cpio`): librpm knows every payload
compression rpm writes, and the tar is then unpacked with tarfile's `data` filter exactly
as a .deb's data.tar is (no member outside the work area, no device files; links that point
outside, like `/lib/modules/<release>/build`, are left out).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from installer.packages.builder.inputs import PackageBuildError

RPM_MAGIC = b"\xed\xab\xee\xdb"
_HEADER_MAGIC = b"\x8e\xad\xe8\x01"
_MAX_TAGS = 0xFFFF  # rpm's HEADER_TAGS_MAX
_MAX_DATA = 256 * 1024**2  # rpm's HEADER_DATA_MAX
_TAGS = {1000: "name", 1001: "version", 1002: "release", 1003: "epoch", 1022: "arch"}
_STRING, _INT32 = 6, 4
_UNPACK_TIMEOUT = 900


@dataclass(frozen=True)
class RpmHeader:
    """What an RPM says it is."""

    name: str
    epoch: str
    version: str
    release: str
    arch: str

    @property
    def kernel_release(self) -> str:
        """The `uname -r` of a kernel package: version-release.arch (RHEL and AL2023)."""
        return f"{self.version}-{self.release}.{self.arch}"


def is_rpm(path: Path) -> bool:
    """Whether `path` is a file that starts as an RPM does (the lead's magic)."""
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        return handle.read(4) == RPM_MAGIC


def read_header(path: Path) -> RpmHeader:
    """Name, epoch, version, release and arch from the RPM's main header."""
    try:
        with path.open("rb") as handle:
            lead = handle.read(96)
            if len(lead) != 96 or lead[:4] != RPM_MAGIC:
                raise PackageBuildError(f"{path} is not an RPM (no RPM lead)")
            _read_entries(handle, path, align=True)  # the signature header
            found = _read_entries(handle, path, align=False)
    except OSError as exc:
        raise PackageBuildError(f"cannot read {path}: {exc.strerror or exc}") from None
    missing = [tag for tag in ("name", "version", "release", "arch") if not found.get(tag)]
    if missing:
        raise PackageBuildError(f"{path}: its RPM header has no {', '.join(missing)}")
    return RpmHeader(found["name"], found.get("epoch", ""), found["version"],
                     found["release"], found["arch"])


def _read_entries(handle: BinaryIO, path: Path, *, align: bool) -> dict[str, str]:
    """One header structure: magic, counts, index entries, data; the tags of `_TAGS`."""
    intro = handle.read(16)
    if len(intro) != 16 or intro[:4] != _HEADER_MAGIC:
        raise PackageBuildError(f"{path}: damaged RPM header (no header magic)")
    count, size = struct.unpack(">II", intro[8:16])
    if count > _MAX_TAGS or size > _MAX_DATA:
        raise PackageBuildError(f"{path}: RPM header claims {count} tags, {size} bytes "
                                f"(rpm's limits: {_MAX_TAGS}, {_MAX_DATA})")
    index, data = handle.read(16 * count), handle.read(size)
    if len(index) != 16 * count or len(data) != size:
        raise PackageBuildError(f"{path}: the RPM header is cut short")
    if align and size % 8:
        handle.read(8 - size % 8)
    found: dict[str, str] = {}
    for at in range(0, len(index), 16):
        tag, kind, offset, items = struct.unpack(">iiii", index[at:at + 16])
        name = _TAGS.get(tag)
        if name is None or not 0 <= offset < size or items < 1:
            continue
        if kind == _STRING:
            end = data.find(b"\0", offset)
            found[name] = data[offset:end if end >= 0 else size].decode("utf-8", "replace")
        elif kind == _INT32 and offset + 4 <= size:
            found[name] = str(struct.unpack(">I", data[offset:offset + 4])[0])
    return found


def extract_rpm(rpm: Path, dest: Path) -> None:
    """Unpack the RPM's payload into `dest` (unsafe members refused, links out left out)."""
    tool = shutil.which("rpm2archive")
    if tool is None:
        raise PackageBuildError(f"{rpm.name}: reading an RPM needs rpm2archive",
                                remedy="apt-get install rpm2cpio")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as spool, rpm.open("rb") as source:
        try:
            done = subprocess.run([tool, "-n", "-"], stdin=source, stdout=spool,
                                  stderr=subprocess.PIPE, timeout=_UNPACK_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise PackageBuildError(f"{rpm}: rpm2archive ran over {_UNPACK_TIMEOUT} s") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            raise PackageBuildError(f"{rpm}: cannot unpack its payload (rpm2archive: "
                                    f"{why[-1] if why else f'exit {done.returncode}'})")
        spool.seek(0)
        try:
            with tarfile.open(fileobj=spool, mode="r:") as archive:
                # safe: tarfile's "data" filter, links pointing outside left out
                archive.extractall(dest, filter=_inside_only)  # noqa: S202
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise PackageBuildError(f"{rpm}: cannot unpack its payload ({exc})") from None


def _inside_only(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def unpack_kernel_devel(rpm: Path, root: Path, sha256: str
                        ) -> tuple[dict[Path, str], dict[str, str]]:
    """Unpack a `kernel-devel` RPM into `root`: the trees it added under
    `/usr/src/kernels/`, each claiming the package's release, and its provenance entry."""
    header = read_header(rpm)
    kernels = root / "usr" / "src" / "kernels"
    before = set(kernels.iterdir()) if kernels.is_dir() else set()
    extract_rpm(rpm, root)
    added = {p for p in kernels.iterdir() if p.is_dir()} - before if kernels.is_dir() else set()
    is_kernel = re.match(r"^kernel[0-9.]*(-[a-z0-9]+)*-devel$", header.name) is not None
    claims = {tree: header.kernel_release for tree in added} if is_kernel else {}
    epoch = f"{header.epoch}:" if header.epoch not in ("", "0") else ""
    return claims, {"name": header.name, "version": f"{epoch}{header.version}-"
                    f"{header.release}", "sha256": sha256}
