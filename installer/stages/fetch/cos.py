"""The `cos` source: Google's published GPU artifacts for this node's COS build.

COS loads only modules signed by Google, so on COS nodes the package is assembled from
Google's own artifacts (cos-tools' cos_gpu_installer layout, docs/cos.md): the version files
say what `default`, `latest` and each branch are; `nvidia-drivers-<v>.tgz` holds the signed
prebuilt (open) modules and firmware signatures; NVIDIA's public runfile holds the user-mode
files. Every object is checked against Cloud Storage's `x-goog-hash` (no sha256 is
published); the assembled package then carries our manifest with sha256s and is cached like
any download, so later boots are the fast path with no network.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.compat import gpusupport
from installer.compat.toolkit import driver_branch
from installer.errors import IncompatibleError, PackageNotFoundError
from installer.node.facts import NodeInfo
from installer.packages.build import PackageBuildError
from installer.packages.cache import Cache
from installer.packages.cos import gcshash, layout
from installer.packages.cos.assemble import ArtifactError, assemble
from installer.packages.manifest import MANIFEST_NAME, Package
from installer.packages.repository import Candidate, Index, package_path
from installer.packages.tree import read_tree
from installer.stages.fetch.download import Downloader
from installer.stages.fetch.failures import NotOnMirror
from installer.stages.fetch.sources import Offer, commit_tree
from installer.stages.fetch.urls import safe

MAX_ARTIFACT = 4 * 1024**3
OPEN_ONLY_REMEDY = (
    "COS publishes signed prebuilt modules only in the open flavour; for these GPUs use GKE's "
    "own installer (node pool with gpu-driver-version=default, or cos-gpu-installer's "
    "daemonset-preloaded.yaml), which relinks and signs the proprietary modules")


class CosUnsupportedGpuError(IncompatibleError):
    """A GPU of this COS node needs the proprietary modules, which COS ships no prebuilt of."""


class CosSource:
    """Packages assembled from the cos-tools bucket for the node's COS build."""

    def __init__(self, node: NodeInfo, settings: CosSettings, downloader: Downloader,
                 cache: Cache, log: Any, requested: str) -> None:
        self.node, self.settings, self.downloader = node, settings, downloader
        self.cache, self.log, self.requested = cache, log, requested
        self.build = node.os.cos_build or ""
        self.board = layout.board_of(node.os.cos_board)
        self.base = layout.cos_tools_url(settings.cos_tools_url, settings.zone)
        self.runfiles = layout.runfile_base(settings.runfile_url, settings.zone)
        self.name = f"cos {safe(self.base)} build {self.build}"
        self._prefix: str | None = None  # the prefix form this build answered under

    def offers(self) -> Offer:
        """The version files of this build, with COS's fallbacks for GPUs a branch cannot
        drive; a node whose GPUs need proprietary modules is refused before any request."""
        refuse_proprietary_only(self.node)
        published = self._version_files()
        aliases = {layout.alias_key(alias): v for alias, v in published.items()}
        aliases.update(fallbacks(aliases, gpusupport.node_architectures(self.node), self.log))
        kernel, arch = self.node.kernel_release, self.node.kernel_arch
        found = tuple(Candidate(v, kernel, arch, "open", package_path(kernel, v, "open"),
                                source=self.name) for v in sorted(set(aliases.values())))
        return Offer(self.name, Index(found, aliases), exhaustive=False)

    def _version_files(self) -> dict[str, str]:
        """alias -> version from the first prefix form that has any version file."""
        for prefix in layout.prefixes(self.base, self.build, self.board):
            found = {}
            for alias in layout.ALIASES:
                data = self._small(f"{prefix}/{layout.version_file(alias)}")
                if data is not None:
                    found[alias] = layout.parse_version_file(data, layout.version_file(alias))
            if found:
                self._prefix = prefix
                return found
        raise PackageNotFoundError(f"{self.name} publishes no gpu_*_version file (looked "
                                   f"under {self.build}/{self.board or ''})",
                                   remedy="check the node's COS build has GPU support, or "
                                   "set COS_TOOLS_URL to a mirror that has this build")

    def _small(self, url: str) -> bytes | None:
        """A version file's bytes, checked; None when the build does not publish it."""
        temp = self.cache.temp_path("version")
        try:
            return self._object(url, temp, layout.MAX_VERSION_FILE).read_bytes()
        except NotOnMirror:
            return None
        finally:
            temp.unlink(missing_ok=True)

    def _object(self, url: str, dest: Path, limit: int) -> Path:
        """Download one object and check it against its x-goog-hash."""
        digests, headers = self.downloader.fetch_object(url, dest, limit=limit,
                                                        hasher=gcshash.Digests)
        gcshash.check(safe(url), headers.get(gcshash.HEADER), digests)
        return dest

    def get(self, candidate: Candidate) -> Package:
        """Download both artifacts, assemble, check the kernel, store in the cache."""
        if self._prefix is None:
            self._version_files()
        version = candidate.driver_version
        work = self.cache.temp_path(f"cos-{version}")
        work.mkdir()
        try:
            package = self._assemble(version, work)
            self.log.info("package assembled", source=self.name, driver=version,
                          files=len(package.manifest.files))
            data = (package.root / MANIFEST_NAME).read_bytes()
            return commit_tree(self.cache, package, data, self.requested)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _assemble(self, version: str, work: Path) -> Package:
        tgz_url = f"{self._prefix}/{layout.modules_tarball(version)}"
        try:
            tgz = self._object(tgz_url, work / "modules.tgz", MAX_ARTIFACT)
        except NotOnMirror:
            raise PackageNotFoundError(
                f"COS build {self.build} has no prebuilt modules for driver {version} "
                f"({safe(tgz_url)} is missing)", remedy="pick a version its gpu_*_version "
                "files name (gpu-node-installer versions), or wait for Google to publish "
                "it") from None
        run = self._object(layout.runfile_url(self.runfiles, version, self.node.kernel_arch),
                           work / layout.runfile_name(version), MAX_ARTIFACT)
        try:
            built = assemble(tgz, run, work / "unpacked", work / "package", version=version,
                             build_id=self.build)
        except PackageBuildError as exc:
            raise ArtifactError(f"COS artifacts for {version}: {exc.message}") from None
        if built.manifest.kernel_release != self.node.kernel_release:
            raise ArtifactError(f"COS build {self.build}'s modules are for kernel "
                                f"{built.manifest.kernel_release}, this node runs "
                                f"{self.node.kernel_release}")
        return read_tree(built.directory, source=self.name)


@dataclass(frozen=True)
class CosSettings:
    """Where the artifacts are (None: Google's buckets, the copy nearest `zone`)."""

    cos_tools_url: str | None = None
    runfile_url: str | None = None
    zone: str | None = None


def refuse_proprietary_only(node: NodeInfo) -> None:
    """Kepler to Volta (K80, P4, P100, V100) need proprietary modules: refuse, no download."""
    archs = gpusupport.node_architectures(node)
    if archs and "open" not in gpusupport.flavours_for(archs):
        raise CosUnsupportedGpuError(
            f"the {', '.join(archs)} GPU(s) on this COS node need the proprietary kernel "
            "modules", remedy=OPEN_ONLY_REMEDY)


def fallbacks(aliases: dict[str, str], archs: list[str], log: Any) -> dict[str, str]:
    """`default`/`latest` naming a branch that cannot drive a GPU here fall back, as
    cos_gpu_installer does (K80 -> R470; L4, H100 -> R535), to the published branch
    nearest to it that drives every GPU."""
    branches = {k: v for k, v in aliases.items() if k.isdigit()}
    replaced: dict[str, str] = {}
    for alias in ("default", "latest"):
        target = aliases.get(alias)
        if target is None or not gpusupport.unsupported_architectures(target, archs):
            continue
        working = gpusupport.filter_versions(branches.values(), archs)
        if working:
            own = driver_branch(target)
            choice = min(working, key=lambda v: abs(driver_branch(v) - own))
            log.info("cos alias falls back", alias=alias, published=target, chosen=choice,
                     gpus=archs)
            replaced[alias] = choice
    return replaced

