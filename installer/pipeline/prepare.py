"""`prepare --kernel RELEASE`: the driver package for a kernel that is installed but not
running (the next boot's), put into the host cache verified, so that boot's `install` takes
it from there: no download, no compile.

The package is resolved exactly as `install` resolves one (DRIVER_VERSION_MAP, the version
and flavour rules, preloaded -> cache -> mirrors -> COS, then BUILD_FALLBACK), by the same
fetch stage, run on the detected node with its kernel release replaced by RELEASE. Nothing
else of an install runs: no module is loaded, no device node made, nothing staged, no
readiness or install state written; the cache is only added to (never pruned here).

Concurrency: a lock of its own (`<install dir>/.prepare.lock`, not waited for: a second
preparation is refused, exit 13) and never the node lock, so an install never waits behind
a preparation that compiles for minutes. The cache tolerates both at once: blobs enter by
atomic rename after their hash matched, each run has its own temp folder, and a package
is reported ready only once all its blobs are confirmed present.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from installer.context import Context
from installer.errors import (
    ConfigError,
    InstallerError,
    IntegrityError,
    LockHeldError,
    PackageNotFoundError,
    printable,
)
from installer.installdir import ownership
from installer.installdir.layout import cache_root, prepare_lock_path
from installer.node.documents import quote
from installer.node.interrupts import Signalled
from installer.node.lock import holder_pid, node_lock
from installer.packages.manifest import KERNEL_RELEASE_RE
from installer.pipeline import runner
from installer.pipeline.preparespace import build_command, check_space
from installer.stages.detect import require_gpus

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo
    from installer.packages.manifest import Package

STATES = ("ready", "missing", "failed")
SOURCES = ("preloaded", "cache", "mirror", "cos", "built")


@dataclass
class PrepareResult:
    """What `prepare` found or made; `-o json` prints `to_dict()` (its keys are a contract),
    whatever the outcome. `failure` is the error the command then exits with."""

    kernel: str
    arch: str | None = None
    driver_version: str | None = None
    flavour: str | None = None
    state: str = "failed"
    source: str | None = None
    digest: str | None = None
    build_command: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    failure: InstallerError | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch, "driver_version": self.driver_version,
                "flavour": self.flavour, "state": self.state, "source": self.source,
                "digest": self.digest, "build_command": self.build_command,
                "error": self.error, "duration_s": self.duration_s}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        where = f"kernel {self.kernel} ({self.arch or 'arch unknown'})"
        if self.state == "ready":
            return (f"Prepared NVIDIA {self.driver_version} ({self.flavour}) for {where}: "
                    f"in the cache from {self.source}, sha256 {self.digest}")
        if self.state == "missing":
            return f"No package for {where}; build it with:\n  {self.build_command}"
        return f"Preparing {where} failed: {self.error}"

    def log_fields(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "state": self.state, "source": self.source,
                "driver": self.driver_version, "duration_s": self.duration_s}


def check_release(value: str | None) -> str:
    """RELEASE as `uname -r` prints it (it names a directory: no '/', no leading '.'),
    or ConfigError (exit 2) before anything is read or written."""
    if value is None or not KERNEL_RELEASE_RE.match(value):
        shown = "missing" if value is None else quote(value, 60)
        raise ConfigError(f"--kernel {shown} is not a kernel release (1 to 128 letters, "
                          "digits and . _ + ~ -, starting with a letter or digit)",
                          remedy="pass the release as `uname -r` prints it or as named under "
                                 "/lib/modules, e.g. --kernel 6.1.0-28-cloud-amd64")
    return value


def prepare(make_ctx: Callable[[], Context], kernel: str | None) -> PrepareResult:
    """Resolve, fetch or build, and confirm the package for `kernel`; never raises an
    InstallerError (it is the result's `failure`, after the result is filled in)."""
    started = time.monotonic()
    result = PrepareResult(kernel="" if kernel is None else printable(kernel[:200]))
    ctx: Context | None = None
    try:
        release = check_release(kernel)
        ctx = make_ctx()
        _prepare(ctx, release, result)
    except InstallerError as exc:
        result.failure = exc
        result.state = "missing" if isinstance(exc, PackageNotFoundError) else "failed"
    except Signalled as sig:  # SIGTERM/SIGINT outside a stage (the map, the lock): the same
        result.failure = sig.error("prepare", "during prepare, outside its stages")
    result.duration_s = round(time.monotonic() - started, 3)
    if result.failure is not None:
        result.error = result.failure.one_line()
    if ctx is not None:
        log = ctx.log.info if result.failure is None else ctx.log.warning
        log("kernel prepared" if result.failure is None else "kernel not prepared",
            **result.log_fields())
    return result


def _prepare(ctx: Context, release: str, result: PrepareResult) -> None:
    from installer.upgrade import versionmap

    versionmap.apply(ctx)  # the per-pool rules, as install: a bad map is exit 2, nothing read
    running = runner.detect(ctx)
    require_gpus(running)  # as install: a GPU-less node gets nothing (exit 3)
    target = target_node(ctx, running, release)
    result.arch = target.kernel_arch
    runner.run_stage(ctx, "space", lambda c: check_space(c, target))
    ownership.guard(ctx.config, ctx.host.roots)  # a dir not ours: refused before the lock
    lock = prepare_lock_path(ctx.config, ctx.host.roots)
    try:
        with node_lock(lock, timeout=0):
            package = _fetch(ctx, target, running, result)
    except LockHeldError:
        pid = holder_pid(lock)
        raise LockHeldError(
            f"another preparation ({f'PID {pid}' if pid else 'an unknown process'}) holds "
            f"{lock}", remedy="wait for it to end: one preparation runs at a time") from None
    manifest = package.manifest
    result.driver_version, result.flavour = manifest.driver_version, manifest.flavour
    result.digest, result.state = package.digest, "ready"
    result.source = source_kind(package)


def target_node(ctx: Context, running: NodeInfo, release: str) -> NodeInfo:
    """The detected node as it will be when booted into `release`: same OS, arch, GPUs and
    security; that kernel; nothing loaded. A release not installed under /lib/modules is
    still resolved (sources need only its name); building needs its headers."""
    if not _installed(ctx, release):
        ctx.log.warning("kernel not installed on the node", kernel=release,
                        reason=f"no /lib/modules/{release}: only a package from a source "
                               "can be prepared, not a build")
    if (release != running.kernel_release and running.os.cos_build
            and ctx.config.cos_source == "auto"):
        ctx.log.info("cos source skipped", kernel=release,
                     reason=f"COS build {running.os.cos_build}'s artifacts are for its own "
                            f"kernel {running.kernel_release}")
        ctx.config = replace(ctx.config, cos_source="never")
    return replace(running, kernel_release=release, loaded_driver=None)


def _installed(ctx: Context, release: str) -> bool:
    try:
        return ctx.host.roots.node(PurePosixPath("/lib/modules") / release).is_dir()
    except (OSError, ValueError):
        return False


def _fetch(ctx: Context, target: NodeInfo, running: NodeInfo,
           result: PrepareResult) -> Package:
    """The fetch stage for `target` (no pruning), then the cache's blobs confirmed."""
    from installer.stages import fetch as stage

    ctx.node = target
    try:
        package = runner.run_stage(ctx, "fetch", lambda c: stage.run(c, prune=False))
    except PackageNotFoundError as exc:
        result.driver_version, result.flavour, result.build_command = build_command(
            ctx, target, running)
        missing = type(exc)(exc.message, remedy=f"build and publish it: "
                            f"{result.build_command}; or {exc.remedy}")
        missing.stage = exc.stage
        raise missing from None
    if source_kind(package) != "preloaded":  # a preloaded tree is read in place, verified
        runner.run_stage(ctx, "confirm", lambda c: _confirm(c, package))
    return package


def _confirm(ctx: Context, package: Package) -> None:
    """Every blob of the package is in the cache (a concurrent install's prune could have
    swept one between its download and its ref): ready means the boot finds it whole."""
    from installer.packages.cache import Cache, cached_package

    if cached_package(Cache(cache_root(ctx.config, ctx.host.roots)), package.digest,
                      verify=False) is None:
        raise IntegrityError(f"package {package.manifest.key} is no longer whole in the cache "
                             "after it was stored", remedy="run prepare again")


def source_kind(package: Package) -> str:
    """Which kind of source delivered the package, from the name the fetch stage gave it."""
    name = package.source
    if name == "build on node":
        return "built"
    for kind in ("cache", "mirror", "cos"):
        if name.startswith(f"{kind} "):
            return kind
    return "preloaded"  # "preloaded <dir>", or the tarball's path it was unpacked from
