"""`--kernel-headers-from-dnf kernel-devel-<release>`: a RHEL-family kernel's build tree,
fetched by name from a dnf repository and verified the way dnf verifies it.

The chain of trust is dnf's (`repo_gpgcheck`): `repodata/repomd.xml` must carry a good
detached signature (`repomd.xml.asc`) by a key of `--dnf-keyring` (checked by `gpgv`; an
armored key file, as distributions ship them in `/etc/pki/rpm-gpg/`, is converted first);
the `primary` metadata must have the size and sha256 repomd.xml lists; each package the
size and sha256 that primary lists. Checksums other than sha256 (sha1, md5) vouch for
nothing and are refused. Among the packages a name matches, the highest by rpm's ordering
(epoch, version, release: `rpmvercmp`) is taken. Every download goes through the project's
downloader (`Remote`) and is hashed while it streams; nothing unverified is parsed or kept.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import gzip
import importlib
import lzma
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin
from xml.etree import ElementTree

from installer.errors import IntegrityError, PackageNotFoundError
from installer.packages.builder.aptarchive import ArchiveIntegrityError
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.remote import Remote
from installer.packages.builder.rpmvercmp import evr_compare

_SPEC_RE = re.compile(r"^(kernel[0-9.]*(?:-[a-z0-9]+)*?-devel)"  # kernel6.12-devel too
                      r"(?:-([0-9][A-Za-z0-9._+~^-]{0,120}))?$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~^-]{0,250}\.rpm$")
_MAX_REPOMD = 4 * 1024**2
_MAX_SIGNATURE = 64 * 1024
_MAX_PRIMARY = 4 * 1024**3  # uncompressed: AppStream's primary is some 100 MB today
_REPO_NS = "{http://linux.duke.edu/metadata/repo}"
_COMMON_NS = "{http://linux.duke.edu/metadata/common}"
_XML_BASE = "{http://www.w3.org/XML/1998/namespace}base"
_REMEDY = "use a mirror that serves the repository unchanged, or give the key that signs it " \
          "(--dnf-keyring)"


@dataclass(frozen=True)
class RpmEntry:
    """One package of `primary`: what it is, where it is, what it must hash to."""

    name: str
    arch: str
    evr: tuple[str, str, str]
    url: str
    size: int
    checksum_type: str
    checksum: str

    @property
    def nevra(self) -> str:
        epoch = f"{self.evr[0]}:" if self.evr[0] not in ("", "0") else ""
        return f"{self.name}-{epoch}{self.evr[1]}-{self.evr[2]}.{self.arch}"


def fetch_kernel_devel(specs: tuple[str, ...], mirror: str, keyring: Path | None, work: Path,
                       remote: Remote, *, arch: str = "x86_64") -> tuple[Path, ...]:
    """Each named `kernel-devel` RPM (the highest that matches), verified, in `work`."""
    wanted = [_parse_spec(spec) for spec in specs]
    if keyring is None:
        raise PackageBuildError("--kernel-headers-from-dnf needs --dnf-keyring (no key is "
                                "trusted by default)", remedy="pass the repository's public "
                                "key, e.g. --dnf-keyring /etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-9")
    if not mirror.startswith(("http://", "https://", "file://")):
        raise PackageBuildError(f"--dnf-mirror must be an http(s):// or file:// URL, not "
                                f"{mirror!r}", remedy="e.g. --dnf-mirror https://dl.rockylinux"
                                ".org/pub/rocky/9/AppStream/x86_64/os")
    work.mkdir(parents=True, exist_ok=True)
    base = mirror.rstrip("/") + "/"
    entries = _primary(base, _gpgv_keyring(keyring, work), work, remote,
                       {name for name, _ in wanted}, arch)
    paths: dict[str, Path] = {}
    for name, tail in wanted:
        entry = choose(name, tail, entries, arch)
        if entry.nevra not in paths:
            paths[entry.nevra] = _download(entry, base, work, remote)
    return tuple(paths.values())


def _parse_spec(spec: str) -> tuple[str, str | None]:
    match = _SPEC_RE.match(spec)
    if match is None:
        raise PackageBuildError(f"--kernel-headers-from-dnf {spec!r} is not a kernel-devel"
                                "[-<release>] package name",
                                remedy="e.g. --kernel-headers-from-dnf "
                                       "kernel-devel-5.14.0-427.13.1.el9_4.x86_64")
    return match[1], match[2]


def choose(name: str, tail: str | None, entries: list[RpmEntry], arch: str) -> RpmEntry:
    """The highest `name` of `arch` whose version, version-release or version-release.arch
    is `tail` (any, without one)."""
    candidates = [e for e in entries if e.name == name and e.arch == arch and tail in (
        None, e.evr[1], f"{e.evr[1]}-{e.evr[2]}", f"{e.evr[1]}-{e.evr[2]}.{e.arch}")]
    if not candidates:
        have = sorted({e.nevra for e in entries if e.name == name})[-5:]
        raise PackageBuildError(
            f"the repository has no {name}" + (f"-{tail}" if tail else "") + f" for {arch}"
            + (f" (it has {', '.join(have)})" if have else ""),
            remedy="check the release and --dnf-mirror (kernel-devel is in AppStream on "
                   "RHEL and Rocky, in the main repository on Amazon Linux 2023)")
    best = candidates[0]
    for entry in candidates[1:]:
        if evr_compare(entry.evr, best.evr) > 0:
            best = entry
    return best


def _gpgv_keyring(keyring: Path, work: Path) -> Path:
    """The key file as gpgv reads it: binary as given, or an armored key converted."""
    data = keyring.read_bytes()
    blocks = re.findall(rb"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(.*?)"
                        rb"-----END PGP PUBLIC KEY BLOCK-----", data, re.S)
    if not blocks:
        return keyring.resolve()
    binary = bytearray()
    for block in blocks:
        body = block.split(b"\n\n", 1)[-1] if b"\n\n" in block else block.split(
            b"\r\n\r\n", 1)[-1]
        lines = [line.strip() for line in body.splitlines()
                 if line.strip() and not line.strip().startswith(b"=")]
        try:
            binary += base64.b64decode(b"".join(lines), validate=True)
        except (binascii.Error, ValueError):
            raise PackageBuildError(f"--dnf-keyring {keyring}: damaged armored key") from None
    converted = work / "dnf-keyring.gpg"
    converted.write_bytes(bytes(binary))
    return converted


def _verified_repomd(base: str, keyring: Path, work: Path, remote: Remote) -> bytes:
    url = urljoin(base, "repodata/repomd.xml")
    data = remote.fetch_bytes(url, _MAX_REPOMD)
    try:
        signature = remote.fetch_bytes(url + ".asc", _MAX_SIGNATURE)
    except PackageNotFoundError:
        raise ArchiveIntegrityError(f"{url} has no detached signature ({url}.asc is not "
                                    "there)", remedy="use a repository signed for dnf's "
                                    "repo_gpgcheck, or a mirror that copies repomd.xml.asc"
                                    ) from None
    (work / "repomd.xml").write_bytes(data)
    (work / "repomd.xml.asc").write_bytes(signature)
    home = work / "gnupg"  # empty: no trustedkeys of this machine's user count
    home.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(["gpgv", "--homedir", str(home), "--keyring", str(keyring),
                           str(work / "repomd.xml.asc"), str(work / "repomd.xml")],
                          capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        why = next((line for line in done.stderr.decode(errors="replace").splitlines()
                    if "BAD signature" in line or "No public key" in line
                    or "no valid OpenPGP" in line or "not a detached" in line),
                   "no good signature")
        raise ArchiveIntegrityError(f"{url} is not signed by a key of {keyring} "
                                    f"(gpgv: {why.removeprefix('gpgv: ')})", remedy=_REMEDY)
    return data


def _primary(base: str, keyring: Path, work: Path, remote: Remote, names: set[str],
             arch: str) -> list[RpmEntry]:
    """The entries of `names` in the primary metadata the signed repomd.xml vouches for."""
    repomd = _verified_repomd(base, keyring, work, remote)
    try:
        root = ElementTree.fromstring(repomd)  # noqa: S314 (signed, bounded, no DTD use)
    except ElementTree.ParseError as exc:
        raise ArchiveIntegrityError(f"{base}repodata/repomd.xml is not XML ({exc})",
                                    remedy=_REMEDY) from None
    data = next((d for d in root.iter(f"{_REPO_NS}data") if d.get("type") == "primary"), None)
    location = data.find(f"{_REPO_NS}location") if data is not None else None
    checksum = data.find(f"{_REPO_NS}checksum") if data is not None else None
    size = data.findtext(f"{_REPO_NS}size", "") if data is not None else ""
    if location is None or checksum is None or not size.isdigit():
        raise ArchiveIntegrityError(f"{base}repodata/repomd.xml lists no primary metadata "
                                    "with its location, checksum and size", remedy=_REMEDY)
    href = location.get("href", "")
    url = urljoin(base, href)
    _require_sha256(checksum.get("type", ""), f"{base}repodata/repomd.xml", "primary")
    target = work / ("primary" + "".join(Path(href).suffixes[-1:]))
    try:
        remote.fetch_file(url, target, size=int(size), sha256=(checksum.text or "").strip())
    except IntegrityError as exc:
        raise ArchiveIntegrityError(f"{url} is not the primary metadata the signed "
                                    f"repomd.xml lists ({exc.message})", remedy=_REMEDY
                                    ) from None
    with _open_metadata(target) as stream:
        return list(_entries(stream, base, names, arch))


def _require_sha256(kind: str, where: str, what: str) -> None:
    if kind not in ("sha256",):
        raise ArchiveIntegrityError(
            f"{where} vouches for {what} with a {kind or 'missing'} checksum, which this "
            "client cannot trust (only sha256 is checked; sha1 and md5 are unverifiable)",
            remedy="rebuild the repository metadata with sha256 (createrepo_c's default)")


@contextmanager
def _open_metadata(path: Path) -> Iterator[_Bounded]:
    """The metadata file decompressed by its suffix (.gz, .xz, .bz2, .zst or plain)."""
    with path.open("rb") as raw:
        if path.suffix == ".zst":
            with _zstd_reader(path, raw) as zst:
                yield _Bounded(zst)
            return
        opened: Any = (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz"
                       else lzma.LZMAFile(raw) if path.suffix == ".xz"  # noqa: SIM115
                       else bz2.BZ2File(raw) if path.suffix == ".bz2" else raw)
        with opened:  # closes what was opened above
            yield _Bounded(opened)


def _zstd_reader(path: Path, raw: IO[bytes]) -> Any:
    """zstd (Fedora's and newer createrepo_c's default) through the zstandard module."""
    try:
        zstandard = importlib.import_module("zstandard")
    except ImportError:
        raise PackageBuildError(f"{path.name}: the repository's metadata is zstd-compressed "
                                "and the zstandard module is missing",
                                remedy="pip install zstandard") from None
    return zstandard.ZstdDecompressor().stream_reader(raw)


class _Bounded:
    """A reader that stops a decompression bomb at `_MAX_PRIMARY` bytes."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.total = inner, 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.inner.read(size if size > 0 else 1024**2)
        self.total += len(data)
        if self.total > _MAX_PRIMARY:
            raise PackageBuildError(f"the primary metadata is over {_MAX_PRIMARY} bytes "
                                    "uncompressed")
        return data


def _entries(stream: _Bounded, base: str, names: set[str], arch: str) -> Iterator[RpmEntry]:
    """`<package>`s named in `names` (of `arch`), read one at a time (primary is large)."""
    try:
        for _, element in ElementTree.iterparse(stream):  # noqa: S314 (verified by sha256)
            if element.tag != f"{_COMMON_NS}package":
                continue
            name = element.findtext(f"{_COMMON_NS}name", "")
            if name in names and element.findtext(f"{_COMMON_NS}arch", "") == arch:
                yield _entry(element, name, arch, base)
            element.clear()
    except (ElementTree.ParseError, OSError, EOFError, lzma.LZMAError) as exc:
        raise ArchiveIntegrityError(f"the primary metadata of {base} is unreadable ({exc})",
                                    remedy=_REMEDY) from None


def _entry(element: ElementTree.Element, name: str, arch: str, base: str) -> RpmEntry:
    version = element.find(f"{_COMMON_NS}version")
    checksum = element.find(f"{_COMMON_NS}checksum")
    location = element.find(f"{_COMMON_NS}location")
    size = element.find(f"{_COMMON_NS}size")
    package_size = size.get("package", "") if size is not None else ""
    if version is None or checksum is None or location is None or not package_size.isdigit():
        raise ArchiveIntegrityError(f"the primary metadata of {base} lists {name} without "
                                    "its version, checksum, location or size", remedy=_REMEDY)
    href = location.get("href", "")
    where = location.get(_XML_BASE) or base
    return RpmEntry(name, arch, (version.get("epoch", "0"), version.get("ver", ""),
                                 version.get("rel", "")),
                    urljoin(where.rstrip("/") + "/", href), int(package_size),
                    checksum.get("type", ""), (checksum.text or "").strip().lower())


def _download(entry: RpmEntry, base: str, work: Path, remote: Remote) -> Path:
    """The package into `work`, kept only when it has the size and sha256 primary lists."""
    _require_sha256(entry.checksum_type, "the primary metadata", entry.nevra)
    name = entry.url.rsplit("/", 1)[-1]
    schemes = ("http://", "https://", *(("file://",) if base.startswith("file://") else ()))
    if not _FILE_RE.match(name) or not entry.url.startswith(schemes):
        raise ArchiveIntegrityError(f"the primary metadata places {entry.nevra} at "
                                    f"{entry.url!r}, which is not an .rpm of the mirror's scheme",
                                    remedy=_REMEDY)
    target = work / name
    try:
        remote.fetch_file(entry.url, target, size=entry.size, sha256=entry.checksum)
    except IntegrityError as exc:
        target.unlink(missing_ok=True)
        raise ArchiveIntegrityError(
            f"{entry.url} is not the package the signed primary metadata lists "
            f"({entry.size} bytes, sha256 {entry.checksum[:16]}...): {exc.message}",
            remedy=_REMEDY) from None
    return target
