"""`package build --cos-build`: the package a COS node assembles, made ahead of time.

Checks the flags (one line, exit 2, before any request), then runs the fetch stage's COS
assembly with a downloader of its own; the result is written like any `package build`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from installer.config import values
from installer.errors import ConfigError
from installer.packages.builder import BuildResult
from installer.packages.cos import layout
from installer.packages.manifest import DRIVER_VERSION_RE

_OTHER_INPUTS = ("debs", "trees", "run_files", "modules_dir", "nvidia_sources",
                 "kernel_headers", "patches")


def build_from_cos(cos: dict[str, Any], options: dict[str, Any], output_dir: Path | None
                   ) -> BuildResult:
    """Resolve the request through the build's version files and assemble the package."""
    from installer.stages.fetch.cos import CosSettings, CosTarget, build_package
    from installer.stages.fetch.download import Downloader, DownloadSettings

    _check(cos, options, output_dir)
    urls = {key: _url(cos[key], key, cos["allow_http"])
            for key in ("cos_tools_url", "nvidia_runfile_url")}
    target = CosTarget(cos["cos_build"], cos["cos_board"] or None, None, options["arch"])
    log = structlog.get_logger("package-build")
    downloader = Downloader(DownloadSettings(ca_bundle=cos["ca_bundle"],
                                             allow_http=cos["allow_http"]), log)
    where = {"repo": options["repo"], "aliases": tuple(options["aliases"])} if options[
        "repo"] else {"output": output_dir}
    try:
        return build_package(target, CosSettings(urls["cos_tools_url"],
                                                 urls["nvidia_runfile_url"]),
                             downloader, options["driver_version"] or "default", log, **where)
    finally:
        downloader.close()


def _check(cos: dict[str, Any], options: dict[str, Any], output_dir: Path | None) -> None:
    given = [name for name in _OTHER_INPUTS if options.get(name)]
    if given:
        raise ConfigError(f"--cos-build takes its inputs from the bucket; drop "
                          f"--{given[0].replace('_', '-').removesuffix('s')}")
    if not layout.BUILD_ID_RE.match(cos["cos_build"]) or (
            cos["cos_board"] and not layout.BOARD_RE.match(cos["cos_board"])):
        raise ConfigError(f"--cos-build {cos['cos_build']!r} / --cos-board "
                          f"{cos['cos_board']!r} is not a COS build id like 17162.279.34 "
                          "and a board like lakitu")
    if (output_dir is None) == (options["repo"] is None):
        raise ConfigError("say where to write the package: exactly one of --out-dir or --repo")
    requested = options["driver_version"] or "default"
    if not (requested in ("default", "latest") or layout.alias_key(requested).isdigit()
            or DRIVER_VERSION_RE.match(requested)):
        raise ConfigError(f"--driver-version {requested!r} is not default, latest, a branch "
                          "like R535 or a version like 535.261.03")


def _url(value: str | None, name: str, allow_http: bool) -> str | None:
    if value is None:
        return None
    try:
        url = values.api_url(value)
    except values.Invalid:
        url = ""
    if not url or (url.startswith("http://") and not allow_http):
        raise ConfigError(f"--{name.replace('_', '-')} {value!r} is not an https:// URL",
                          remedy="give an https:// URL, or http:// with --allow-http")
    return url
