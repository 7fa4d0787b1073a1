"""`preflight`: before a kernel or node image rolls out, does every (kernel, arch, pool) get
a driver package, and is its branch still supported for the GPU?

Each target is resolved exactly as an install on such a node would resolve it: the version
request from DRIVER_VERSION_MAP's rules (`upgrade.versionmap.resolve`, the Node's labels),
then the fetch stage's own choice (`stages.fetch.choose`: aliases, branches, flavours, the
GPU guard) over what the mirrors' index.json files offer. Only index.json is read, and for
COS the version files and a HEAD of each artifact; never a package body. A mirror that
cannot be read is its error (not "missing"). The lifecycle data (`compat.lifecycle`) adds
warnings; `--post-events` posts a Warning Event on a node of each target not served.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from installer.compat import lifecycle
from installer.compat.toolkit import driver_branch
from installer.config import Config
from installer.context import Context
from installer.errors import (
    ConfigError,
    DownloadError,
    IncompatibleError,
    InstallerError,
    PackageNotFoundError,
)
from installer.node import kube
from installer.node.facts import NodeInfo, Security
from installer.node.gpus import ARCHITECTURES
from installer.node.host import RealHost, Roots
from installer.node.osinfo import OsInfo
from installer.node.pci import KIND_GPU, PciFunction
from installer.packages.cache import Cache
from installer.packages.manifest import DRIVER_VERSION_RE
from installer.packages.repository import flavour_order, version_key
from installer.pipeline import fleet
from installer.pipeline.fleet import Target
from installer.pipeline.preflightreport import (
    READY,
    UNSUPPORTED,
    Report,
    Row,
    build_command,
)
from installer.stages import fetch
from installer.stages.fetch.sources import MirrorSource, Offer
from installer.upgrade import versionmap

EVENT_REASON = "DriverPackageMissing"
# choose() reads the context's config, log and the node given; the host seam is never used
_NO_HOST = RealHost(Roots(Path("/"), Path("/"), Path("/"), Path("/")))


@dataclass(frozen=True)
class Plan:
    """What to check and how strictly."""

    targets: tuple[Target, ...]
    today: datetime.date
    strict: bool = False


def version_rules(config: Config) -> tuple[versionmap.Entry, ...]:
    """DRIVER_VERSION_MAP's entries (read once), or none."""
    if config.driver_version_map is None:
        return ()
    return versionmap.read(config.driver_version_map)


def chooser(config: Config) -> Callable[[dict[str, str], str], versionmap.Choice]:
    """The per-pool version rule for a Node's labels and name (the map read once; a bad
    override label names its node)."""
    entries = version_rules(config)
    return lambda labels, node: versionmap.resolve(replace(config, node_name=node), entries,
                                                   labels)


def plan(config: Config, flags: fleet.Flags, nodes: list[dict[str, Any]] | None,
         source: str, today: datetime.date, *, strict: bool) -> Plan:
    """Every target: the flags', then the Node list's grouped by pool and version rule."""
    targets = list(flags.targets)
    if nodes is not None:
        targets += fleet.node_targets(nodes, source, cos_build=flags.cos_build,
                                      choose=chooser(config), rollout=flags.rollout)
    if not targets:
        raise ConfigError("preflight has nothing to check",
                          remedy="give --kernel RELEASE[,ARCH], --nodes FILE|- or --cos-build")
    return Plan(tuple(targets), today, strict)


def run(config: Config, log: Any, plan: Plan) -> Report:
    """Resolve every target; nothing is written but a temp dir of COS version files."""
    if not config.mirrors and not any(t.cos_build for t in plan.targets):
        raise ConfigError("preflight has no source to check: no mirror is set",
                          remedy="set --mirror (DRIVER_MIRRORS) to the repositories the "
                                 "nodes use, or give --cos-build")
    entries = version_rules(config)
    rows = []
    with _downloads(config, log) as (downloader, work):
        offers = _mirror_offers(config, log, downloader, work)
        for target in plan.targets:
            choice = versionmap.resolve(config, entries, target.label_map)
            row = Row(target.kernel, target.arch, target.pool, choice.version, choice.rule,
                      gpu=target.gpu[0] if target.gpu else None, nodes=target.nodes)
            if target.cos_build:
                from installer.pipeline import preflightcos

                preflightcos.resolve(config, log, downloader, work, target, choice, row)
            else:
                _resolve(config, log, target, choice, offers, row)
            _lifecycle(row, target, plan.today)
            rows.append(row)
    return Report(rows, plan.today.isoformat(), plan.strict)


@contextmanager
def _downloads(config: Config, log: Any) -> Iterator[tuple[Any, Path]]:
    from installer.stages.fetch.download import Downloader, DownloadSettings

    downloader = Downloader(DownloadSettings(
        connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
        deadline=config.download_deadline, attempts=config.download_retries,
        parallel=config.download_parallel, ca_bundle=config.ca_bundle,
        allow_http=config.allow_http), log)
    try:
        with tempfile.TemporaryDirectory(prefix="gni-preflight-") as work:
            yield downloader, Path(work)
    finally:
        downloader.close()


def _mirror_offers(config: Config, log: Any, downloader: Any, work: Path) -> list[Offer]:
    """Every mirror's index.json; one that cannot be read ends the run naming it."""
    cache = Cache(work / "cache")  # never written: offers() reads index.json only
    mirrors: list[MirrorSource] = []
    for base in config.mirrors:
        mirrors.append(MirrorSource(base, downloader, cache, lambda: mirrors,
                                    parallel=1, log=log, requested=config.driver_version))
    offers = fetch.gather(list(mirrors), log)
    for offer in offers:
        failure = offer.failure
        if failure is None:
            continue
        if isinstance(failure, PackageNotFoundError):
            raise DownloadError(f"preflight cannot read {offer.source}: {failure.message}",
                                remedy="check the mirror URL (it must serve index.json)")
        raise type(failure)(f"preflight cannot read {offer.source}: {failure.message}",
                            remedy=failure.remedy)
    return offers


def node_of(target: Target) -> NodeInfo:
    """A node as the install would see it, built from the target (its GPU from labels)."""
    functions: tuple[PciFunction, ...] = ()
    if target.gpu is not None:
        model, arch = target.gpu
        known = ARCHITECTURES[arch]
        functions = (PciFunction("labels", "", "0x030200", KIND_GPU, model, arch, "", None,
                                 known.flavours, known.preferred_flavour),)
    return NodeInfo(_os_of(target.os_image), target.kernel, target.arch, functions, None,
                    Security(None, False, None))


def _os_of(image: str) -> OsInfo:
    """os-release's ID and VERSION_ID as far as a Node's osImage tells them."""
    words = image.lower().split()
    if "container-optimized" in words:
        return OsInfo("cos", None, None, image)
    name = words[0] if words else "unknown"
    version = next((w for w in words[1:] if w[:1].isdigit()), None)
    if name == "ubuntu" and version:
        version = ".".join(version.split(".")[:2])
    return OsInfo(name, version, None, image or None)


def _resolve(config: Config, log: Any, target: Target, choice: versionmap.Choice,
             offers: list[Offer], row: Row) -> None:
    node = node_of(target)
    wanted = replace(config, driver_version=choice.version, flavour=choice.flavour)
    ctx = Context(config=wanted, host=_NO_HOST, log=log, node=node)
    try:
        found = fetch.choose(ctx, node, offers)
    except IncompatibleError as exc:
        row.state, row.reason = UNSUPPORTED, exc.message
        return
    except PackageNotFoundError as exc:
        row.reason = exc.message
        row.driver = _wanted(choice.version, offers, target.arch)
        flavours = flavour_order(choice.flavour, node)
        row.flavour = flavours[0] if flavours else None
        if row.driver is not None and row.flavour is not None:
            row.build = build_command(target.kernel, target.arch, row.driver, row.flavour)
        return
    row.driver, row.flavour, row.source = found.driver_version, found.flavour, found.source
    row.state = READY


def _wanted(requested: str, offers: list[Offer], arch: str) -> str | None:
    """The exact version an unserved request means: itself, its alias in an index, else
    the newest offered version of the branch (or of all, for default/latest)."""
    if DRIVER_VERSION_RE.match(requested):
        return requested
    for offer in offers:
        target = offer.index.aliases.get(requested)
        if target is not None and DRIVER_VERSION_RE.match(target):
            return target
        if target is not None:
            requested = target
    versions = {c.driver_version for o in offers for c in o.index.packages
                if c.arch in ("", arch) and (not requested.isdigit()
                                             or str(driver_branch(c.driver_version))
                                             == requested)}
    return max(versions, key=version_key) if versions else None


def _lifecycle(row: Row, target: Target, today: datetime.date) -> None:
    """Support and end-of-life findings of the row's driver for its GPU; an error makes the
    row unsupported."""
    if row.driver is None:
        return
    archs = [target.gpu[1]] if target.gpu else []
    row.findings = lifecycle.findings(row.driver, row.flavour or "auto", archs, today)
    errors = [f for f in row.findings if f.level == "error"]
    if errors and row.state == READY:
        row.state, row.reason = UNSUPPORTED, errors[0].message


def post_events(config: Config, report: Report) -> None:
    """A Warning Event on the first node of each target not served; failures are noted in
    the report, never fatal (the answer is printed all the same)."""
    failing = [row for row in report.failing if row.nodes]
    if not failing:
        return
    api = kube.connect(config, os.environ)
    if api is None:
        raise ConfigError("--post-events needs the Kubernetes API, and there is no API server "
                          "URL or service-account token", remedy="run in the cluster (or set "
                          "KUBE_API_URL and --service-account-dir), or drop --post-events")
    for row in failing:
        node = row.nodes[0]
        message = (f"preflight: kernel {row.kernel} {row.arch} (pool {row.pool}, "
                   f"{len(row.nodes)} node(s)) has no driver package: {row.reason}"
                   + (f"; make it: {row.build}" if row.build else ""))
        try:
            kube.post_node_event(api, node, reason=EVENT_REASON, message=message,
                                 event_type="Warning")
            report.events.append(f"event: {EVENT_REASON} posted on node {node}")
        except (kube.KubeError, InstallerError) as exc:
            report.events.append(f"event: not posted on node {node}: {exc}")


def nodes_from_api(config: Config) -> list[dict[str, Any]]:
    """The cluster's Nodes, read with the pod's service account (the CronJob's input)."""
    api = kube.connect(config, os.environ)
    if api is None:
        raise ConfigError("--nodes-from-api needs the Kubernetes API, and there is no API "
                          "server URL or service-account token", remedy="run in the cluster "
                          "(or set KUBE_API_URL and --service-account-dir), or give --nodes")
    try:
        return kube.list_items(api, "/api/v1/nodes")
    except kube.KubeError as exc:
        raise DownloadError(f"the Node list could not be read from the API: {exc}",
                            remedy="check the API server and the RBAC (nodes list)") from None
