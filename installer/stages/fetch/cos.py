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
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.compat import gpusupport
from installer.compat.toolkit import driver_branch
from installer.errors import IncompatibleError, PackageNotFoundError
from installer.node.facts import NodeInfo
from installer.packages.builder import BuildResult, PackageBuildError
from installer.packages.cache import Cache
from installer.packages.cos import gcshash, layout
from installer.packages.cos.assemble import ArtifactError, assemble
from installer.packages.manifest import DRIVER_VERSION_RE, MANIFEST_NAME, Package
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


@dataclass(frozen=True)
class CosTarget:
    """Which build's artifacts, for what kernel (None: whatever the modules are built for),
    arch and GPU architectures (the fallbacks and the open-only refusal need them)."""

    build_id: str
    board: str | None
    kernel_release: str | None
    arch: str = "x86_64"
    gpu_architectures: tuple[str, ...] = ()

    @classmethod
    def of_node(cls, node: NodeInfo) -> CosTarget:
        return cls(node.os.cos_build or "", layout.board_of(node.os.cos_board),
                   node.kernel_release, node.kernel_arch,
                   tuple(gpusupport.node_architectures(node)))


class CosArtifacts:
    """One COS build's artifacts: what its version files name, and a package assembled from
    its signed modules and NVIDIA's runfile (downloads go to `work`)."""

    def __init__(self, target: CosTarget, settings: CosSettings, downloader: Downloader,
                 work: Path, log: Any) -> None:
        self.target, self.downloader, self.work, self.log = target, downloader, work, log
        self.base = layout.cos_tools_url(settings.cos_tools_url, settings.zone)
        self.runfiles = layout.runfile_base(settings.runfile_url, settings.zone)
        self.name = source_name(self.base, target.build_id)
        self._prefix: str | None = None  # the prefix form this build answered under
        self._aliases: dict[str, str] | None = None

    def aliases(self) -> dict[str, str]:
        """Request name (`default`, `latest`, `535`) -> version, COS's fallbacks applied;
        a node whose GPUs need proprietary modules is refused before any request."""
        if self._aliases is None:
            refuse_proprietary_only(list(self.target.gpu_architectures))
            published = {layout.alias_key(a): v for a, v in self._version_files().items()}
            published.update(fallbacks(published, list(self.target.gpu_architectures),
                                       self.log))
            self._aliases = published
        return self._aliases

    def _version_files(self) -> dict[str, str]:
        """alias -> version from the first prefix form that has any version file."""
        target = self.target
        for prefix in layout.prefixes(self.base, target.build_id, target.board):
            found = {}
            for alias in layout.ALIASES:
                data = self._small(f"{prefix}/{layout.version_file(alias)}")
                if data is not None:
                    found[alias] = layout.parse_version_file(data, layout.version_file(alias))
            if found:
                self._prefix = prefix
                return found
        raise PackageNotFoundError(
            f"{self.name} publishes no gpu_*_version file (looked under "
            f"{target.build_id}/{target.board or ''})", remedy="check the COS build has GPU "
            "support, or set COS_TOOLS_URL to a mirror that has this build")

    def _small(self, url: str) -> bytes | None:
        """A version file's bytes, checked; None when the build does not publish it."""
        temp = self.work / "version-file"
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

    def assemble(self, version: str, **where: Any) -> BuildResult:
        """Download both artifacts and build the package (`output=` or `repo=`, as
        BuildRequest takes them); the modules must be for the target's kernel."""
        self.aliases()
        tgz_url = f"{self._prefix}/{layout.modules_tarball(version)}"
        try:
            tgz = self._object(tgz_url, self.work / "modules.tgz", MAX_ARTIFACT)
        except NotOnMirror:
            raise PackageNotFoundError(
                f"COS build {self.target.build_id} has no prebuilt modules for driver "
                f"{version} ({safe(tgz_url)} is missing)", remedy="pick a version its "
                "gpu_*_version files name (gpu-node-installer versions), or wait for Google "
                "to publish it") from None
        run = self._object(layout.runfile_url(self.runfiles, version, self.target.arch),
                           self.work / layout.runfile_name(version, self.target.arch),
                           MAX_ARTIFACT)
        try:
            built = assemble(tgz, run, self.work / "unpacked", version=version,
                             build_id=self.target.build_id, arch=self.target.arch, **where)
        except PackageBuildError as exc:
            raise ArtifactError(f"COS artifacts for {version}: {exc.message}") from None
        kernel = self.target.kernel_release
        if kernel is not None and built.manifest.kernel_release != kernel:
            raise ArtifactError(f"COS build {self.target.build_id}'s modules are for kernel "
                                f"{built.manifest.kernel_release}, this node runs {kernel}")
        return built


class CosSource:
    """Packages assembled from the cos-tools bucket for the node's COS build."""

    def __init__(self, node: NodeInfo, settings: CosSettings, downloader: Downloader,
                 cache: Cache, log: Any, requested: str) -> None:
        self.node, self.settings, self.downloader = node, settings, downloader
        self.cache, self.log, self.requested = cache, log, requested
        self.name = source_name(layout.cos_tools_url(settings.cos_tools_url, settings.zone),
                                node.os.cos_build or "")
        self._artifacts: CosArtifacts | None = None

    def _open(self) -> CosArtifacts:
        if self._artifacts is None:
            work = self.cache.temp_path("cos")
            work.mkdir()
            self._artifacts = CosArtifacts(CosTarget.of_node(self.node), self.settings,
                                           self.downloader, work, self.log)
        return self._artifacts

    def offers(self) -> Offer:
        aliases = self._open().aliases()
        kernel, arch = self.node.kernel_release, self.node.kernel_arch
        found = tuple(Candidate(v, kernel, arch, "open", package_path(kernel, v, "open", arch),
                                source=self.name) for v in sorted(set(aliases.values())))
        return Offer(self.name, Index(found, aliases), exhaustive=False)

    def get(self, candidate: Candidate) -> Package:
        """Assemble in the cache's temp area, then store it like a download."""
        artifacts = self._open()
        out = artifacts.work / "package"
        try:
            built = artifacts.assemble(candidate.driver_version, output=out)
            package = read_tree(built.directory, source=self.name)
            self.log.info("package assembled", source=self.name,
                          driver=candidate.driver_version, files=len(package.manifest.files))
            data = (package.root / MANIFEST_NAME).read_bytes()
            return commit_tree(self.cache, package, data, self.requested)
        finally:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(artifacts.work / "unpacked", ignore_errors=True)


@dataclass(frozen=True)
class CosSettings:
    """Where the artifacts are (None: Google's buckets, the copy nearest `zone`)."""

    cos_tools_url: str | None = None
    runfile_url: str | None = None
    zone: str | None = None


def source_name(base: str, build_id: str) -> str:
    return f"cos {safe(base)} build {build_id}"


def build_package(target: CosTarget, settings: CosSettings, downloader: Downloader,
                  requested: str, log: Any, **where: Any) -> BuildResult:
    """`package build --cos-build`: the package a node of that build would assemble, made
    ahead of time (for a preloaded image or an internal mirror)."""
    with tempfile.TemporaryDirectory(prefix="gni-cos-") as work:
        artifacts = CosArtifacts(target, settings, downloader, Path(work), log)
        aliases = artifacts.aliases()
        version = requested if DRIVER_VERSION_RE.match(requested) else aliases.get(
            requested.removeprefix("R"))
        if version is None:
            raise PackageNotFoundError(
                f"{artifacts.name} has no gpu_{requested}_version file",
                remedy=f"use one it publishes: {', '.join(sorted(aliases)) or 'none'}")
        return artifacts.assemble(version, **where)


def refuse_proprietary_only(archs: list[str]) -> None:
    """Kepler to Volta (K80, P4, P100, V100) need proprietary modules: refuse, no download."""
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

