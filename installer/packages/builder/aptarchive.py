"""An apt archive (Debian's, Ubuntu's), read the way apt reads it, through the project's
downloader (`builder.remote.Remote`: retries, resume, deadline, CA bundle, file:// mirrors).

Each suite's `InRelease` must carry a good signature by a key of the keyring (default
Debian's own, from `debian-archive-keyring`; Ubuntu's is
`/usr/share/keyrings/ubuntu-archive-keyring.gpg`), checked by `gpgv`. Each `Packages`
index must have the size and SHA256 that signed Release lists, and each .deb the size and
SHA256 that index lists: a download is hashed while it streams into the work directory and
a mismatch keeps nothing, so nothing unverified is ever unpacked. Release and Packages are
parsed by python-debian's deb822 and versions ordered by its `Version` (dpkg's rules),
both imported only when an archive is read (`package build --help` stays fast).
"""

from __future__ import annotations

import gzip
import lzma
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from installer.errors import DownloadError, IntegrityError, PackageNotFoundError
from installer.packages.builder.inputs import PackageBuildError, file_sha256
from installer.packages.builder.remote import Remote

DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
_MAX_RELEASE_BYTES = 16 * 1024**2
_MAX_INDEX_BYTES = 512 * 1024**2  # Debian's main Packages, uncompressed: about 50 MB today
_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_INDEXES = ((".xz", lzma.open), (".gz", gzip.open))
_OPS = {"<<": lambda c: c < 0, "<=": lambda c: c <= 0, "=": lambda c: c == 0,
        ">=": lambda c: c >= 0, ">>": lambda c: c > 0}


class ArchiveIntegrityError(IntegrityError):
    """The archive's signature or a hash does not check out (exit 7)."""

    default_remedy = ("use a mirror that serves the archive unchanged, or give the keyring "
                      "that signs it (--apt-keyring; Ubuntu's: " f"{UBUNTU_KEYRING})")


@dataclass(frozen=True)
class Stanza:
    """One package of a `Packages` index: what it is, where it is, what it must hash to,
    and what it depends on (name, (operator, version) or None; of alternatives the first)."""

    name: str
    version: str
    filename: str
    size: int
    sha256: str
    depends: tuple[tuple[str, tuple[str, str] | None], ...]


class AptArchive:
    """One mirror: its suites' verified indexes (read once per run) and its .debs."""

    def __init__(self, remote: Remote, mirror: str, work: Path, *, arch: str = "x86_64",
                 keyring: Path | None = None) -> None:
        keyring = keyring or DEFAULT_KEYRING
        if not keyring.is_file():
            raise PackageBuildError(f"the archive keyring {keyring} does not exist",
                                    remedy="install debian-archive-keyring, or pass "
                                           f"--apt-keyring FILE (Ubuntu's: {UBUNTU_KEYRING})")
        if not mirror.startswith(("http://", "https://", "file://")):
            raise PackageBuildError(f"--apt-mirror must be an http://, https:// or file:// "
                                    f"URL, not {mirror}")
        self.remote, self.mirror, self.keyring = remote, mirror.rstrip("/"), keyring
        self.arch = _DEB_ARCH[arch]
        self.work = work
        self._releases: dict[str, dict[str, tuple[int, str]]] = {}
        self._indexes: dict[tuple[str, str, str], list[Stanza]] = {}

    def index(self, suites: tuple[str, ...], components: tuple[str, ...],
              family: re.Pattern[str]) -> dict[str, list[Stanza]]:
        """The packages named like `family` in the suites' Packages for this arch (of the
        components each Release lists), every index after its signed Release vouched for it;
        a package in several suites lists each version."""
        found: dict[str, list[Stanza]] = {}
        for suite in suites:
            hashes, read = self._release(suite), False
            for component in components:
                path = next((f"{component}/binary-{self.arch}/Packages{suffix}"
                             for suffix, _ in _INDEXES
                             if f"{component}/binary-{self.arch}/Packages{suffix}" in hashes),
                            None)
                if path is None:
                    continue
                read = True
                for stanza in self._packages(suite, path, hashes[path], family):
                    found.setdefault(stanza.name, []).append(stanza)
            if not read:
                raise ArchiveIntegrityError(
                    f"the signed Release of {self.mirror} {suite} lists no "
                    f"{'/'.join(components)} binary-{self.arch}/Packages.xz or .gz",
                    remedy="check --apt-mirror and --apt-suite")
        return found

    def download(self, stanza: Stanza, work: Path) -> Path:
        """One .deb into `work`, hashed as it streams; kept only if it matches the index."""
        work.mkdir(parents=True, exist_ok=True)
        target = work / Path(stanza.filename).name
        self._fetch(f"{self.mirror}/{stanza.filename}", target, stanza.size, stanza.sha256,
                    "the signed Packages index")
        return target

    def _release(self, suite: str) -> dict[str, tuple[int, str]]:
        """path -> (size, sha256) of the suite's signed Release (InRelease), once."""
        if suite not in self._releases:
            url = f"{self.mirror}/dists/{suite}/InRelease"
            try:
                data = self.remote.fetch_bytes(url, _MAX_RELEASE_BYTES)
            except PackageNotFoundError as exc:
                raise PackageNotFoundError(exc.message, remedy=f"check --apt-mirror and "
                                           f"--apt-suite (is {suite} a suite of that "
                                           "archive?)") from None
            except DownloadError as exc:
                raise _reworded(exc) from None
            text = self._verified(data, url)
            from debian import deb822

            table: dict[str, tuple[int, str]] = {}
            for entry in deb822.Release(text).get("SHA256", []):
                if str(entry.get("size", "")).isdigit():
                    table[entry["name"]] = (int(entry["size"]), entry["sha256"].lower())
            self._releases[suite] = table
        return self._releases[suite]

    def _verified(self, data: bytes, url: str) -> str:
        """The signed text of InRelease, once `gpgv` found a good signature by the keyring."""
        self.work.mkdir(parents=True, exist_ok=True)
        signed = self.work / "InRelease"
        signed.write_bytes(data)
        done = subprocess.run(["gpgv", "--keyring", str(self.keyring), "--output", "-",
                               str(signed)], capture_output=True, timeout=120, check=False)
        signed.unlink()
        if done.returncode != 0:
            why = next((line for line in done.stderr.decode(errors="replace").splitlines()
                        if "BAD signature" in line or "No public key" in line
                        or "no valid OpenPGP" in line), "no good signature")
            raise ArchiveIntegrityError(f"{url} is not signed by a key of {self.keyring} "
                                        f"(gpgv: {why.removeprefix('gpgv: ')})")
        return done.stdout.decode(errors="replace")

    def _packages(self, suite: str, path: str, signed: tuple[int, str],
                  family: re.Pattern[str]) -> list[Stanza]:
        """One Packages index's stanzas of `family`, downloaded and parsed once per run."""
        key = (suite, path, family.pattern)
        if key not in self._indexes:
            self._indexes[key] = self._read_packages(suite, path, signed, family)
        return self._indexes[key]

    def _read_packages(self, suite: str, path: str, signed: tuple[int, str],
                       family: re.Pattern[str]) -> list[Stanza]:
        local = self.work / f"{suite}_{path.replace('/', '_')}"
        self._fetch(f"{self.mirror}/dists/{suite}/{path}", local, *signed,
                    "the signed Release")
        opener: Any = dict(_INDEXES)[Path(path).suffix]
        try:
            with opener(local, "rb") as handle:
                text = _bounded(handle, f"{self.mirror}/dists/{suite}/{path}")
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise ArchiveIntegrityError(f"{self.mirror}/dists/{suite}/{path} does not "
                                        f"decompress: {exc}") from None
        finally:
            local.unlink(missing_ok=True)
        return list(_parse(text, family))

    def _fetch(self, url: str, dest: Path, size: int, sha256: str, by: str) -> None:
        """`url` into `dest` through the downloader; what differs from the signed size and
        SHA256 is removed and named against `by`."""
        try:
            self.remote.fetch_file(url, dest, size=size, sha256=sha256)
        except PackageNotFoundError as exc:
            raise PackageNotFoundError(exc.message, remedy=f"the mirror lacks a file {by} "
                                       "lists: retry once it has synced, or use another "
                                       "--apt-mirror") from None
        except DownloadError as exc:
            raise _reworded(exc) from None
        except IntegrityError as exc:
            got = dest.stat().st_size if dest.is_file() else 0
            digest = file_sha256(dest)[:16] if dest.is_file() else "?"
            dest.unlink(missing_ok=True)
            # a stream that overran stops before its last chunk is kept: the downloader says so
            shown = (f"more than {size} bytes" if "sent more than" in exc.message
                     else f"{got} bytes with sha256 {digest}...")
            raise ArchiveIntegrityError(f"{url} is {shown}, but {by} says {size} bytes, "
                                        f"{sha256[:16]}...") from None


def _reworded(exc: DownloadError) -> DownloadError:
    """A download failure with the apt archive's remedy (TLS and deadline keep theirs)."""
    if type(exc) is not DownloadError:
        return exc
    return DownloadError(exc.message, remedy="check --apt-mirror, the network and proxy, "
                         "and --ca-bundle for an https mirror behind a private CA")


def _bounded(handle: IO[bytes], url: str) -> str:
    data = handle.read(_MAX_INDEX_BYTES + 1)
    if len(data) > _MAX_INDEX_BYTES:
        raise ArchiveIntegrityError(f"{url} is larger than {_MAX_INDEX_BYTES} bytes "
                                    "uncompressed")
    return data.decode(errors="replace")


def _parse(text: str, family: re.Pattern[str]) -> Iterator[Stanza]:
    """The stanzas of packages named like `family` (deb822 parses only those: the whole of
    Debian's main takes seconds, the kernel's packages a fraction of one)."""
    from debian import deb822

    name_re = re.compile(r"^Package:[ \t]*(\S+)[ \t]*$", re.M)
    for block in re.split(r"\n[ \t]*\n", text):
        named = name_re.search(block)
        if named is None or not family.fullmatch(named[1]):
            continue
        fields = deb822.Packages(block)
        if not all(fields.get(key) for key in ("Version", "Filename", "Size", "SHA256")):
            continue
        depends = tuple((alternatives[0]["name"], alternatives[0]["version"])
                        for alternatives in fields.relations["depends"] or () if alternatives)
        yield Stanza(fields["Package"], fields["Version"], fields["Filename"],
                     int(fields["Size"]) if fields["Size"].isdigit() else -1,
                     fields["SHA256"].lower(), depends)


def satisfies(version: str, relation: tuple[str, str]) -> bool:
    """Whether `version` meets a dependency's (operator, version), by dpkg's ordering."""
    from debian.debian_support import version_compare

    operator, wanted = relation
    test = _OPS.get(operator)
    return test is not None and test(version_compare(version, wanted))


def choose(package: str, index: dict[str, list[Stanza]],
           relation: tuple[str, str] | None) -> Stanza:
    """The highest version of `package` (by dpkg's ordering, across every suite read) that
    meets `relation`."""
    from debian.debian_support import Version

    candidates = [s for s in index.get(package, [])
                  if relation is None or satisfies(s.version, relation)]
    if not candidates:
        have = sorted({s.version for s in index.get(package, [])}, key=Version)
        wanted = f" ({relation[0]} {relation[1]})" if relation else ""
        if relation and relation[0] == "=":
            wanted = f" {relation[1]}"
        raise PackageBuildError(
            f"the archive has no {package}{wanted}"
            + (f" (it has {', '.join(have)})" if have else ""),
            remedy="check the name, the version and --apt-mirror/--apt-suite (an older "
                   "version may be only on snapshot.debian.org)")
    return max(candidates, key=lambda s: Version(s.version))
