"""`--kernel-headers-from-apt linux-headers-<release>` (a kernel's headers .debs by name)
and `--nvidia-source-from-apt nvidia-kernel-source[=VERSION]` (NVIDIA's module sources).

A build farm's pods should need no pre-staged files: the headers come from a Debian-style
archive (`--debian-mirror`, as the build root uses), verified the way apt verifies them.
The suite's `InRelease` must carry a good signature by a key of the keyring
(`--debian-keyring`, default Debian's own from `debian-archive-keyring`, checked by
`gpgv`); the `Packages` index must have the size and SHA256 the signed Release lists; each
.deb must have the size and SHA256 that `Packages` lists. A download is hashed while it
streams into the work directory and kept only when it matches, so nothing unverified is
ever unpacked. The package's own `linux-headers-*` and `linux-kbuild-*` dependencies (the
-common tree, the kbuild tools) are fetched with it, at the versions it depends on.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import DownloadError, IntegrityError
from installer.packages.builder.inputs import COPY_CHUNK, PackageBuildError

DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_NAME_RE = re.compile(r"^linux-headers-[A-Za-z0-9][A-Za-z0-9.+~-]{0,120}$")
_MAX_INDEX_BYTES = 512 * 1024**2  # Packages of main, uncompressed: about 50 MB today
_MAX_DEB_BYTES = 2 * 1024**3
_COMPANION_RE = re.compile(r"^(linux-headers-|linux-kbuild-)")
_SOURCE_RE = re.compile(r"^(nvidia(?:-open)?-kernel-source)(?:=([A-Za-z0-9.+~:-]{1,80}))?$")
_COMPONENTS = ("main", "contrib", "non-free")  # NVIDIA's sources: non-free and contrib
_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_TIMEOUT = 60


class ArchiveIntegrityError(IntegrityError):
    """The archive's signature or a hash does not check out (exit 7)."""

    default_remedy = ("use a mirror that serves the archive unchanged, or give the keyring "
                      "that signs it (--debian-keyring)")


@dataclass(frozen=True)
class Stanza:
    """One package of a `Packages` index: what it is, where it is, what it must hash to."""

    name: str
    version: str
    filename: str
    size: int
    sha256: str
    depends: tuple[tuple[str, str | None], ...]


def default_suite(name: str) -> str:
    """The suite of a headers package: trixie's releases say `+deb13`, bookworm's nothing."""
    return "trixie" if "+deb13" in name else "bookworm"


def fetch_headers(names: tuple[str, ...], mirror: str, work: Path, *, arch: str = "x86_64",
                  suite: str | None = None, keyring: Path | None = None) -> tuple[Path, ...]:
    """Each named headers package and its headers/kbuild dependencies, verified, in `work`."""
    for name in names:
        if not _NAME_RE.match(name):
            raise PackageBuildError(f"--kernel-headers-from-apt {name!r} is not a "
                                    "linux-headers-<release> package name",
                                    remedy="e.g. --kernel-headers-from-apt "
                                           "linux-headers-6.1.0-57-amd64")
    keyring = _keyring(keyring)
    work.mkdir(parents=True, exist_ok=True)
    mirror = mirror.rstrip("/")
    debs: dict[str, Path] = {}
    for name in names:
        index = _packages(mirror, suite or default_suite(name), _DEB_ARCH[arch], keyring, work)
        for stanza in _closure(name, index):
            if stanza.filename not in debs:
                debs[stanza.filename] = _deb(mirror, stanza, work)
    return tuple(debs.values())


def fetch_sources(specs: tuple[str, ...], mirror: str, work: Path, *, arch: str = "x86_64",
                  suite: str | None = None, keyring: Path | None = None) -> tuple[Path, ...]:
    """Each `nvidia[-open]-kernel-source[=VERSION]` .deb, verified, in `work`."""
    wanted = []
    for spec in specs:
        match = _SOURCE_RE.match(spec)
        if match is None:
            raise PackageBuildError(f"--nvidia-source-from-apt {spec!r} is not "
                                    "nvidia-kernel-source or nvidia-open-kernel-source "
                                    "[=VERSION]", remedy="e.g. --nvidia-source-from-apt "
                                    "nvidia-kernel-source=535.261.03-1")
        wanted.append((match[1], match[2]))
    keyring = _keyring(keyring)
    work.mkdir(parents=True, exist_ok=True)
    mirror = mirror.rstrip("/")
    index = _packages(mirror, suite or "bookworm", _DEB_ARCH[arch], keyring, work)
    return tuple(_deb(mirror, _choose(name, version, index), work) for name, version in wanted)


def _keyring(keyring: Path | None) -> Path:
    keyring = keyring or DEFAULT_KEYRING
    if not keyring.is_file():
        raise PackageBuildError(f"the archive keyring {keyring} does not exist",
                                remedy="install debian-archive-keyring, or pass "
                                       "--debian-keyring FILE")
    return keyring


def _packages(mirror: str, suite: str, arch: str, keyring: Path, work: Path
              ) -> dict[str, list[Stanza]]:
    """The suite's Packages for `arch` (main, contrib, non-free: those the Release lists),
    each after the signed Release vouched for it."""
    release = _verified_release(_get(f"{mirror}/dists/{suite}/InRelease", 16 * 1024**2),
                                keyring, work, f"{mirror}/dists/{suite}/InRelease")
    hashes = _release_sha256(release)
    found: dict[str, list[Stanza]] = {}
    for component in _COMPONENTS:
        for suffix, open_ in ((".xz", lzma.decompress), (".gz", gzip.decompress)):
            path = f"{component}/binary-{arch}/Packages{suffix}"
            if path in hashes:
                size, digest = hashes[path]
                data = _get(f"{mirror}/dists/{suite}/{path}", size)
                _check(data, size, digest, f"{mirror}/dists/{suite}/{path}",
                       "the signed Release")
                text = open_(data)[:_MAX_INDEX_BYTES].decode(errors="replace")
                for name, stanzas in _parse_packages(text).items():
                    found.setdefault(name, []).extend(stanzas)
                break
    if found:
        return found
    raise ArchiveIntegrityError(f"the signed Release of {mirror} {suite} lists no "
                                f"main/binary-{arch}/Packages.xz or .gz",
                                remedy="check --debian-mirror and the suite")


def _verified_release(data: bytes, keyring: Path, work: Path, url: str) -> str:
    """The signed text of InRelease, once `gpgv` found a good signature by the keyring."""
    signed = work / "InRelease"
    signed.write_bytes(data)
    done = subprocess.run(["gpgv", "--keyring", str(keyring), "--output", "-", str(signed)],
                          capture_output=True, timeout=120, check=False)
    signed.unlink()
    if done.returncode != 0:
        why = next((line for line in done.stderr.decode(errors="replace").splitlines()
                    if "BAD signature" in line or "No public key" in line
                    or "no valid OpenPGP" in line), "no good signature")
        raise ArchiveIntegrityError(f"{url} is not signed by a key of {keyring} "
                                    f"(gpgv: {why.removeprefix('gpgv: ')})")
    return done.stdout.decode(errors="replace")


def _release_sha256(release: str) -> dict[str, tuple[int, str]]:
    """path -> (size, sha256) from the Release's SHA256 field."""
    table: dict[str, tuple[int, str]] = {}
    inside = False
    for line in release.splitlines():
        if not line.startswith(" "):
            inside = line.startswith("SHA256:")
            continue
        parts = line.split()
        if inside and len(parts) == 3 and parts[1].isdigit():
            table[parts[2]] = (int(parts[1]), parts[0].lower())
    return table


def _parse_packages(text: str) -> dict[str, list[Stanza]]:
    found: dict[str, list[Stanza]] = {}
    for block in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+):[ \t]*(.*)$", block, re.M))
        if not {"Package", "Version", "Filename", "Size", "SHA256"} <= fields.keys():
            continue
        depends = tuple(_dependency(d) for d in fields.get("Depends", "").split(",") if d.strip())
        stanza = Stanza(fields["Package"], fields["Version"], fields["Filename"],
                        int(fields["Size"]) if fields["Size"].isdigit() else -1,
                        fields["SHA256"].lower(), depends)
        found.setdefault(stanza.name, []).append(stanza)
    return found


def _dependency(text: str) -> tuple[str, str | None]:
    """`linux-kbuild-6.1 (= 6.1.192-3)` -> (name, exact version); alternatives: the first."""
    first = text.split("|")[0].strip()
    match = re.match(r"^([^\s(:]+)(?::\S+)?\s*(?:\(\s*=\s*([^)\s]+)\s*\))?", first)
    return (match[1], match[2]) if match else (first, None)


def _closure(name: str, index: dict[str, list[Stanza]]) -> list[Stanza]:
    """The package and its headers/kbuild dependencies (the build tree needs them)."""
    wanted: list[tuple[str, str | None]] = [(name, None)]
    chosen: dict[str, Stanza] = {}
    while wanted:
        package, version = wanted.pop()
        if package in chosen:
            continue
        chosen[package] = stanza = _choose(package, version, index)
        wanted += [d for d in stanza.depends if _COMPANION_RE.match(d[0])]
    return [chosen[key] for key in sorted(chosen)]


def _choose(package: str, version: str | None, index: dict[str, list[Stanza]]) -> Stanza:
    """The package at `version` (or the suite's last listed one)."""
    candidates = [s for s in index.get(package, []) if version in (None, s.version)]
    if not candidates:
        have = sorted({s.version for s in index.get(package, [])})
        raise PackageBuildError(
            f"the archive has no {package}" + (f" {version}" if version else "")
            + (f" (it has {', '.join(have)})" if have else ""),
            remedy="check the name, the version and --debian-mirror/--debian-suite (an older "
                   "version may be only on snapshot.debian.org)")
    return candidates[-1]


def _deb(mirror: str, stanza: Stanza, work: Path) -> Path:
    """Download one .deb into `work`, hashed as it streams; kept only if it matches."""
    target = work / Path(stanza.filename).name
    partial = target.with_name(f".{target.name}.part")
    url = f"{mirror}/{stanza.filename}"
    digest, size = hashlib.sha256(), 0
    try:
        with _open(url) as response, partial.open("wb") as out:
            while chunk := response.read(COPY_CHUNK):
                size += len(chunk)
                if size > max(stanza.size, 0) or size > _MAX_DEB_BYTES:
                    break
                digest.update(chunk)
                out.write(chunk)
        if size != stanza.size or digest.hexdigest() != stanza.sha256:
            raise ArchiveIntegrityError(
                f"{url} is {'more than ' if size > stanza.size else ''}{size} bytes with sha256 "
                f"{digest.hexdigest()[:16]}..., but the signed Packages index says "
                f"{stanza.size} bytes, {stanza.sha256[:16]}...")
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _check(data: bytes, size: int, digest: str, url: str, by: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if len(data) != size or actual != digest:
        raise ArchiveIntegrityError(f"{url} is {len(data)} bytes with sha256 {actual[:16]}..., "
                                    f"but {by} says {size} bytes, {digest[:16]}...")


def _get(url: str, limit: int) -> bytes:
    with _open(url) as response:
        data: bytes = response.read(limit + 1)
    return data


def _open(url: str) -> Any:
    if not url.startswith(("http://", "https://")):
        raise PackageBuildError(f"--debian-mirror must be an http:// or https:// URL, not {url}")
    try:
        return urllib.request.urlopen(url, timeout=_TIMEOUT)  # noqa: S310 (scheme checked)
    except (urllib.error.URLError, OSError) as exc:
        raise DownloadError(f"cannot download {url}: {exc}",
                            remedy="check --debian-mirror and the network") from None
