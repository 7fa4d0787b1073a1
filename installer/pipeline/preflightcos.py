"""`preflight --cos-build`: does a COS build publish what a node of it would assemble?

The build's gpu_*_version files are read (small, hash-checked, as the COS source reads them,
with its fallbacks and its open-only refusal), the request resolved against them, then the
signed modules tarball and NVIDIA's runfile are checked with one HEAD each: never
downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from installer.config import Config
from installer.errors import IncompatibleError, PackageNotFoundError
from installer.packages.cos import layout
from installer.packages.manifest import DRIVER_VERSION_RE
from installer.pipeline.fleet import Target
from installer.pipeline.preflightreport import READY, UNSUPPORTED, Row
from installer.stages.fetch import cos, probe
from installer.stages.fetch.download import Downloader
from installer.upgrade.versionmap import Choice


def resolve(config: Config, log: Any, downloader: Downloader, work: Path, target: Target,
            choice: Choice, row: Row) -> None:
    """Fill `row` from the build's artifacts (a download failure propagates)."""
    build = target.cos_build or ""
    archs = (target.gpu[1],) if target.gpu else ()
    settings = cos.CosSettings(cos_tools_url=config.cos_tools_url,
                               runfile_url=config.nvidia_runfile_url, zone=config.node_zone)
    artifacts = cos.CosArtifacts(cos.CosTarget(build, target.cos_board, None, target.arch,
                                               archs), settings, downloader, work, log)
    row.source = artifacts.name
    row.flavour = "open"  # COS publishes signed prebuilt modules only in the open flavour
    try:
        aliases = artifacts.aliases()
    except IncompatibleError as exc:
        row.state, row.reason = UNSUPPORTED, exc.message
        return
    except PackageNotFoundError as exc:
        row.reason = exc.message
        return
    requested = choice.version
    version = requested if DRIVER_VERSION_RE.match(requested) else aliases.get(requested)
    if version is None:
        row.reason = (f"COS build {build} publishes no gpu_{requested}_version file (it has "
                      f"{', '.join(sorted(aliases)) or 'none'})")
        return
    row.driver = version
    base = layout.cos_tools_url(config.cos_tools_url, config.node_zone)
    tarball = layout.modules_tarball(version)
    if not any(probe.exists(downloader, f"{prefix}/{tarball}")
               for prefix in layout.prefixes(base, build, target.cos_board)):
        row.reason = f"COS build {build} has no {tarball} (its signed prebuilt modules)"
        return
    runfile = layout.runfile_url(layout.runfile_base(config.nvidia_runfile_url,
                                                     config.node_zone), version, target.arch)
    if not probe.exists(downloader, runfile):
        row.reason = f"NVIDIA's runfile {layout.runfile_name(version, target.arch)} is not " \
                     "published"
        return
    row.state = READY
