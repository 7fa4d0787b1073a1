"""The `ubuntu` source: Canonical's signed open modules for this Ubuntu node's kernel.

Canonical builds NVIDIA's open modules for each Ubuntu kernel and signs them with the key
that kernel trusts, so a node under Secure Boot loads them with no key of ours. With
UBUNTU_SOURCE=auto, on a node whose os-release ID is `ubuntu`, the archive's `restricted`
component of the release's pockets (`jammy`, `jammy-updates`, `jammy-security`: the suite
from VERSION_ID) says which branches Canonical built for the running kernel; the chosen
one's modules and the user-mode packages of their driver version are downloaded and
verified through the signed InRelease (`packages.builder.ubuntuapt`), assembled into an
ordinary package (`package build --ubuntu-modules`) and cached like any download, so later
boots are the fast path with no network.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, DownloadError, IntegrityError, PackageNotFoundError
from installer.node.facts import NodeInfo
from installer.packages.builder import BuildRequest, PackageBuildError, build
from installer.packages.builder.aptarchive import (
    UBUNTU_KEYRING,
    AptArchive,
    ArchiveIntegrityError,
    Stanza,
)
from installer.packages.builder.ubuntuapt import (
    CODENAMES,
    COMPONENTS,
    UBUNTU_MIRRORS,
    Branch,
    family,
    fetch,
    offered,
    pockets,
)
from installer.packages.cache import Cache
from installer.packages.manifest import MANIFEST_NAME, Package
from installer.packages.repository import Candidate, Index, package_path
from installer.packages.tree import read_tree
from installer.stages.fetch.download import Downloader
from installer.stages.fetch.sources import Offer, commit_tree
from installer.stages.fetch.urls import safe


class UbuntuPackageError(IntegrityError):
    """Canonical's packages, verified by the archive's signature, do not make a package."""

    default_remedy = ("the archive's NVIDIA packages are not what Canonical publishes: check "
                      "UBUNTU_APT_MIRROR, or set UBUNTU_SOURCE=never")


@dataclass(frozen=True)
class UbuntuSettings:
    """Where the archive is (None: Ubuntu's own) and the keyring that signs it."""

    mirror: str | None = None
    keyring: Path | None = None


class UbuntuSource:
    """Packages assembled from the Ubuntu archive for the node's running kernel."""

    def __init__(self, node: NodeInfo, settings: UbuntuSettings, downloader: Downloader,
                 cache: Cache, log: Any, requested: str) -> None:
        self.node, self.settings, self.downloader = node, settings, downloader
        self.cache, self.log, self.requested = cache, log, requested
        self.mirror = (settings.mirror or UBUNTU_MIRRORS.get(node.kernel_arch, "")).rstrip("/")
        self.name = f"ubuntu {safe(self.mirror)}"
        self._archive: AptArchive | None = None
        self._index: dict[str, list[Stanza]] | None = None
        self._branches: dict[Branch, str] = {}

    def _suites(self) -> tuple[str, ...]:
        version = self.node.os.version_id or ""
        codename = CODENAMES.get(version)
        if codename is None:
            raise PackageNotFoundError(
                f"Ubuntu {version or '(no VERSION_ID)'} is not a release the ubuntu source "
                f"knows the archive suite of ({', '.join(sorted(CODENAMES))})",
                remedy="use another driver source (DRIVER_MIRRORS), or UBUNTU_SOURCE=never")
        return pockets((codename,))

    def _open(self) -> tuple[AptArchive, dict[str, list[Stanza]]]:
        """The archive and its verified restricted index (read once per run)."""
        if self._archive is None or self._index is None:
            keyring = self.settings.keyring or UBUNTU_KEYRING
            _check_tools(keyring)
            work = self.cache.temp_path("ubuntu")
            work.mkdir()
            archive = AptArchive(self.downloader, self.mirror, work / "indexes",
                                 arch=self.node.kernel_arch, keyring=keyring)
            with _node_remedies():
                self._index = archive.index(self._suites(), COMPONENTS,
                                            family(self.node.kernel_release))
            self._archive = archive
            self._branches = offered(self._index, self.node.kernel_release)
        return self._archive, self._index

    def offers(self) -> Offer:
        """Each branch built for the kernel, at its user-mode version; aliases: the branch
        number (its `-server` series preferred), `default` and `latest` the newest."""
        self._open()
        kernel, arch = self.node.kernel_release, self.node.kernel_arch
        if not self._branches:
            raise PackageNotFoundError(
                f"{self.name} {'/'.join(self._suites())} restricted has no "
                f"linux-modules-nvidia-<branch>-open-{kernel} with its libnvidia-compute: "
                f"Canonical publishes no signed open modules for kernel {kernel}",
                remedy="run a kernel Ubuntu builds them for, or another driver source "
                       "(DRIVER_MIRRORS, BUILD_FALLBACK=auto)")
        aliases: dict[str, str] = {}
        for branch in sorted(self._branches, key=lambda b: (int(b.number), not b.server)):
            aliases[branch.number] = self._branches[branch]  # -server sorts last: it wins
        if aliases:
            newest = aliases[max(aliases, key=int)]
            aliases.update(default=newest, latest=newest)
        found = tuple(Candidate(v, kernel, arch, "open", package_path(kernel, v, "open", arch),
                                source=self.name) for v in sorted(set(aliases.values())))
        return Offer(self.name, Index(found, aliases))

    def get(self, candidate: Candidate) -> Package:
        """Download and assemble in the cache's temp area, then store it like a download."""
        archive, index = self._open()
        branch = self._branch(candidate.driver_version)
        work = archive.work.parent
        out = work / "package"
        try:
            with _node_remedies():
                debs = fetch(archive, self._suites(), self.node.kernel_release, branch,
                             work / "debs", index=index)
            self._check_version(debs.driver_version, candidate.driver_version, branch)
            built = build(BuildRequest(ubuntu_modules=(debs.modules,), debs=debs.user,
                                       kernel_release=self.node.kernel_release,
                                       arch=self.node.kernel_arch, output=out))
            package = read_tree(built.directory, source=self.name)
            self.log.info("package assembled", source=self.name,
                          driver=candidate.driver_version, branch=branch.suffix,
                          files=len(package.manifest.files))
            data = (package.root / MANIFEST_NAME).read_bytes()
            return commit_tree(self.cache, package, data, self.requested)
        except PackageBuildError as exc:  # the archive vouched for them: not the operator's
            raise UbuntuPackageError(f"Canonical's packages for {candidate.driver_version}: "
                                     f"{exc.message}") from None
        finally:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work / "debs", ignore_errors=True)

    def _check_version(self, modules: str, offered: str, branch: Branch) -> None:
        """The modules' driver version is the one offered (the user-mode packages')."""
        if modules != offered:
            raise PackageNotFoundError(
                f"Canonical's {branch.modules_package(self.node.kernel_release)} is driver "
                f"{modules}, the archive's newest libnvidia-compute-{branch.suffix} {offered}: "
                "the user-mode packages must be the modules' driver version",
                remedy=f"wait until the mirror has synced both, or request {modules}")

    def _branch(self, version: str) -> Branch:
        """The branch offering `version` (-server first), else the version's major number."""
        matching = sorted((b for b, v in self._branches.items() if v == version),
                          key=lambda b: not b.server)
        if matching:
            return matching[0]
        number = version.split(".", 1)[0]
        return next((b for b in sorted(self._branches, key=lambda b: not b.server)
                     if b.number == number), Branch(number, True))


def _check_tools(keyring: Path) -> None:
    """gpgv and the keyring are in the installer's image, not on the node: say so first."""
    if not keyring.is_file():
        raise ConfigError(f"UBUNTU_SOURCE=auto: the Ubuntu archive keyring {keyring} does "
                          "not exist in the installer's container",
                          remedy="mount Ubuntu's ubuntu-archive-keyring.gpg and set "
                                 "UBUNTU_KEYRING to it, or set UBUNTU_SOURCE=never")
    if shutil.which("gpgv") is None:
        raise ConfigError("UBUNTU_SOURCE=auto needs gpgv (it checks the archive's signed "
                          "InRelease), which the installer's image lacks",
                          remedy="use the image's `build` target (it has gpgv), or set "
                                 "UBUNTU_SOURCE=never")


@contextmanager
def _node_remedies() -> Iterator[None]:
    """The archive client's refusals, with the node's settings in their remedies."""
    try:
        yield
    except ArchiveIntegrityError as exc:
        raise ArchiveIntegrityError(exc.message, remedy="use a UBUNTU_APT_MIRROR that serves "
                                    "the archive unchanged, or set UBUNTU_KEYRING to the "
                                    "keyring that signs it") from None
    except DownloadError as exc:
        if type(exc) is not DownloadError:  # TLS, deadline: their own remedies
            raise
        raise DownloadError(exc.message, remedy="check UBUNTU_APT_MIRROR, the network and "
                            "proxy, and DRIVER_CA_BUNDLE for an https mirror behind a "
                            "private CA") from None
