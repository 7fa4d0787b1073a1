"""An ordinary driver package from COS's signed prebuilt modules and NVIDIA's runfile.

`nvidia-drivers-<version>.tgz` (cos_gpu_installer unpacks it with `tar --xattrs`) holds
Google-signed `.ko` files and GSP firmware whose `security.ima` attribute carries Google's
signature (GNU tar's `SCHILY.xattr.*` PAX records); a `<firmware>.sig` member is read the
same way. The modules are taken byte for byte (their appended signatures are what COS's
kernel checks); user-mode files and firmware come from the runfile, unpacked without
running it; the firmware signatures go into the manifest's `ima`, set at staging.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.errors import IntegrityError
from installer.packages.builder import BuildRequest, BuildResult, build
from installer.packages.ima import MAX_SIGNATURE, XATTR
from installer.packages.manifest import HASH_CHUNK

MAX_MODULE = 512 * 1024**2
MAX_MEMBERS = 4096
_PAX_XATTR = f"SCHILY.xattr.{XATTR}"
_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)


class ArtifactError(IntegrityError):
    """A COS artifact does not hold what its layout promises."""

    default_remedy = "the COS artifacts mirror serves a damaged or foreign file: check it"


@dataclass(frozen=True)
class Prebuilt:
    """What the modules tarball held: the modules' directory, firmware and IMA signatures."""

    modules_dir: Path
    firmware: dict[str, str]  # file name -> sha256 (a signature signs exactly those bytes)
    ima: dict[str, bytes]


def unpack_modules(tgz: Path, dest: Path) -> Prebuilt:
    """Every `.ko` streamed into `dest` (flat), firmware digests and signatures kept; members
    that are not plain files, or whose names climb out, are refused."""
    dest.mkdir(parents=True)
    firmware: dict[str, str] = {}
    ima: dict[str, bytes] = {}
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            for count, member in enumerate(tar):
                _check_member(tgz.name, member, count)
                if member.isfile():
                    _take(tar, member, dest, firmware, ima)
    except _READ_ERRORS as exc:
        raise ArtifactError(f"{tgz.name} is not a readable gzip tarball: {exc}") from None
    if not any(dest.glob("*.ko")):
        raise ArtifactError(f"{tgz.name} holds no kernel module (.ko)")
    return Prebuilt(dest, firmware, ima)


def _check_member(where: str, member: tarfile.TarInfo, count: int) -> None:
    name = PurePosixPath(member.name)
    if count >= MAX_MEMBERS or member.size > MAX_MODULE:
        raise ArtifactError(f"{where} has too many or too large members ({member.name!r})")
    if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
        raise ArtifactError(f"{where}: member {member.name!r} is not a plain file or "
                            "directory inside the archive")


def _take(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path,
          firmware: dict[str, str], ima: dict[str, bytes]) -> None:
    """A module is streamed out; a firmware file's digest and `.sig` members are kept."""
    base = PurePosixPath(member.name).name
    in_firmware = "firmware" in PurePosixPath(member.name).parts
    handle = tar.extractfile(member)
    if handle is None:
        raise ArtifactError(f"member {member.name!r} cannot be read")
    with handle:
        if base.endswith(".ko"):
            if (dest / base).exists():
                raise ArtifactError(f"two modules named {base} ({member.name})")
            with (dest / base).open("xb") as out:
                shutil.copyfileobj(handle, out, HASH_CHUNK)
        elif base.endswith(".sig") and in_firmware:
            ima[base.removesuffix(".sig")] = _signature(handle.read(MAX_SIGNATURE + 1),
                                                        member.name)
        elif in_firmware:
            digest = hashlib.sha256()
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
            firmware[base] = digest.hexdigest()
    value = member.pax_headers.get(_PAX_XATTR)
    if value is not None and not base.endswith(".ko"):
        ima[base] = _signature(value.encode("utf-8", "surrogateescape"), member.name)


def _signature(data: bytes, where: str) -> bytes:
    if not 0 < len(data) <= MAX_SIGNATURE:
        raise ArtifactError(f"the IMA signature of {where} is {len(data)} bytes")
    return data


def assemble(tgz: Path, run_file: Path, work: Path, *, version: str, build_id: str,
             arch: str, output: Path | None = None, repo: Path | None = None,
             aliases: tuple[str, ...] = ()) -> BuildResult:
    """The package for one COS build and driver version, written to `output` or `repo`;
    `arch` is the board's (lakitu: x86_64, lakitu-arm64: aarch64), the runfile's and the
    modules' alike, or the build refuses them."""
    prebuilt = unpack_modules(tgz, work / "modules")
    result = build(BuildRequest(run_files=(run_file,), modules_dir=prebuilt.modules_dir,
                                driver_version=version, flavour="open", arch=arch,
                                os={"id": "cos", "build_id": build_id}, output=output,
                                repo=repo, aliases=aliases, force=True,
                                ima=tuple(sorted(prebuilt.ima.items()))))
    _check_firmware(result, prebuilt)
    return result


def _check_firmware(result: BuildResult, prebuilt: Prebuilt) -> None:
    """Firmware in both archives must be the same bytes: a signature signs one file."""
    staged = {PurePosixPath(e.path).name: e for e in result.manifest.files
              if e.kind == "firmware"}
    for name, sha256 in prebuilt.firmware.items():
        entry = staged.get(name)
        if entry is not None and entry.sha256 != sha256:
            raise ArtifactError(f"firmware {name} differs between the modules tarball and "
                                "the runfile, so its signature cannot hold")
