"""Where each COS GPU artifact lives: buckets by region, the build's prefix, object names.

Bucket `cos-tools` (copies `cos-tools-eu`, `cos-tools-asia`) holds, per COS build,
`<BUILD_ID>/<board>/` (older builds: `<BUILD_ID>/`) with `gpu_<alias>_version` files and
the signed prebuilt modules `nvidia-drivers-<version>.tgz`. User-mode files come from
NVIDIA's public runfile bucket `nvidia-drivers-<us|eu|asia>-public`.
"""

from __future__ import annotations

import re

from installer.errors import IntegrityError
from installer.node.osinfo import OsInfo
from installer.packages.manifest import DRIVER_VERSION_RE

STORAGE = "https://storage.googleapis.com"
COS_TOOLS_BUCKETS = {"us": "cos-tools", "eu": "cos-tools-eu", "asia": "cos-tools-asia"}
# a GCE zone's first word -> region of the copies (artifacts.go, installer.go)
_COS_REGIONS = {"us": "us", "northamerica": "us", "southamerica": "us", "europe": "eu",
                "asia": "asia", "australia": "asia"}
_RUNFILE_REGIONS = {"us": "us", "europe": "eu", "asia": "asia"}
# the version files a build may publish; a missing one is simply not offered
ALIASES = ("default", "latest", "R470", "R525", "R535", "R550", "R570", "R575", "R580")
MAX_VERSION_FILE = 256
_BRANCH_ALIAS_RE = re.compile(r"^R(\d{3,4})$")
BUILD_ID_RE = re.compile(r"^\d{4,6}(\.\d{1,6}){1,3}$", re.ASCII)
BOARD_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$", re.ASCII)


def cos_tools_url(configured: str | None, zone: str | None) -> str:
    """The configured base URL, else the regional copy of `cos-tools` for the node's zone."""
    if configured:
        return configured.rstrip("/")
    region = _COS_REGIONS.get((zone or "").split("-", 1)[0], "us")
    return f"{STORAGE}/{COS_TOOLS_BUCKETS[region]}"


def runfile_base(configured: str | None, zone: str | None) -> str:
    """The configured base URL, else NVIDIA's public runfile bucket nearest the zone."""
    if configured:
        return configured.rstrip("/")
    region = _RUNFILE_REGIONS.get((zone or "").split("-", 1)[0], "us")
    return f"{STORAGE}/nvidia-drivers-{region}-public"


def prefixes(base: str, build_id: str, board: str | None) -> list[str]:
    """Where a build's artifacts may be: with the board (current builds), then without."""
    plain = f"{base}/{build_id}"
    return [f"{plain}/{board}", plain] if board else [plain]


def version_file(alias: str) -> str:
    return f"gpu_{alias}_version"


def modules_tarball(version: str) -> str:
    return f"nvidia-drivers-{version}.tgz"


def runfile_name(version: str, arch: str = "x86_64") -> str:
    return f"NVIDIA-Linux-{arch}-{version}.run"


def runfile_url(base: str, version: str, arch: str = "x86_64") -> str:
    return f"{base}/tesla/{version}/{runfile_name(version, arch)}"


def parse_version_file(data: bytes, where: str) -> str:
    """A version file holds one driver version; whitespace around it is dropped."""
    text = data.decode("ascii", errors="replace").strip()
    if not DRIVER_VERSION_RE.match(text):
        raise IntegrityError(f"{where} holds {text[:40]!r}, not a driver version",
                             remedy="the COS artifacts mirror serves a damaged file")
    return text


def alias_key(alias: str) -> str:
    """Our request names for COS's aliases: `R535` is the branch request `535`."""
    match = _BRANCH_ALIAS_RE.match(alias)
    return match.group(1) if match else alias


def board_of(release_board: str | None) -> str | None:
    """The bucket's board from lsb-release's CHROMEOS_RELEASE_BOARD: signed images say
    `lakitu-signed-prempkeys`, the artifacts live under `lakitu/`."""
    return release_board.split("-signed", 1)[0] or None if release_board else None


def on_cos_build(os_info: OsInfo) -> bool:
    """A COS node whose build id (and board) are known and safe to put in a URL."""
    board = board_of(os_info.cos_board)
    return bool(os_info.family == "cos" and os_info.cos_build
                and BUILD_ID_RE.match(os_info.cos_build)
                and (board is None or BOARD_RE.match(board)))
