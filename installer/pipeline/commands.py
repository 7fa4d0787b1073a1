"""What each node-facing CLI command runs: the stages it needs, in order, under the lock.

`install` (installer.pipeline.install) is the whole job; these are the single-stage and
debugging commands. A command that writes on the node holds the node lock, so it never
interleaves with another run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.context import Context
from installer.errors import ConfigError
from installer.installdir import ownership
from installer.installdir.layout import lock_path
from installer.node.lock import node_lock
from installer.pipeline import runner

if TYPE_CHECKING:
    from installer.compat.toolkit import CudaVerdict
    from installer.installdir.readiness import Readiness
    from installer.node.facts import NodeInfo
    from installer.packages.manifest import Package
    from installer.pipeline.cdispec import CdiSpec
    from installer.pipeline.status import StatusReport
    from installer.pipeline.uninstall import UninstallResult
    from installer.stages.fetch import Versions
    from installer.stages.load import LoadResult, UnloadResult
    from installer.stages.signal import SignalResult
    from installer.stages.stage import RollbackResult, StageResult
    from installer.stages.verify import VerifyResult
    from installer.upgrade.versionmap import Choice


@contextmanager
def locked(ctx: Context, *, claim: bool = True) -> Iterator[None]:
    """The install dir's lock: a writing command must not interleave with another run.

    The install and cache dirs are checked first (never a system dir or one not ours) and,
    with `claim`, marked as the installer's under the lock.
    """
    ownership.guard(ctx.config, ctx.host.roots)
    with node_lock(lock_path(ctx.config, ctx.host.roots), timeout=ctx.config.lock_timeout):
        if claim:
            ownership.claim(ctx.config, ctx.host.roots, ctx.log.warning)
        yield


def detect(ctx: Context) -> NodeInfo:
    return runner.detect(ctx)


def fetch(ctx: Context) -> Package:
    _choose_version(ctx)
    with locked(ctx):
        return runner.fetch(ctx)


def versions(ctx: Context) -> ChosenVersions:
    """What each source offers, for the version DRIVER_VERSION_MAP (or the setting) chooses."""
    from installer.stages.fetch import available

    choice = _choose_version(ctx)
    return ChosenVersions(runner.run_stage(ctx, "versions", available), choice.to_dict())


def _choose_version(ctx: Context) -> Choice:
    """The commands that fetch a package take the version DRIVER_VERSION_MAP chooses for
    this node (a bad map: exit 2 before the lock), as `install` does."""
    from installer.upgrade import versionmap

    return versionmap.apply(ctx)


@dataclass(frozen=True)
class ChosenVersions:
    """`versions`' report with the rule that chose the requested version."""

    versions: Versions
    rule: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {**self.versions.to_dict(), "rule": self.rule}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        return (f"{self.versions.to_text()}\nchosen by {self.rule['reason']}"
                f" (flavour {self.rule['flavour']})")


def load(ctx: Context) -> LoadResult:
    _choose_version(ctx)
    with locked(ctx):
        runner.fetch(ctx)
        return runner.load(ctx)


def unload(ctx: Context) -> UnloadResult:
    from installer.stages import load as load_stage

    with locked(ctx):
        return runner.run_stage(ctx, "unload", lambda c: load_stage.unload(c.host))


def stage(ctx: Context) -> StageResult:
    _choose_version(ctx)
    with locked(ctx):
        runner.detect(ctx)
        runner.fetch(ctx)
        return runner.stage(ctx)


def rollback(ctx: Context) -> RollbackResult:
    from installer.installdir import cdifile
    from installer.stages.stage import rollback_stage

    ownership.guard_cdi(ctx.config, ctx.host.roots)  # the spec follows: refuse first
    with locked(ctx):
        result = runner.run_stage(ctx, "stage", rollback_stage)
        cdifile.refresh(ctx.config, ctx.host)  # the CDI spec follows the version in service
        return result


def verify(ctx: Context, *, cuda_smoke: bool, lib_dir: Path | None,
           gpu_count: int | None) -> VerifyResult:
    return runner.verify(ctx, cuda_smoke=cuda_smoke, lib_dir=lib_dir, gpu_count=gpu_count)


def signal(ctx: Context) -> SignalResult:
    ownership.guard_cdi(ctx.config, ctx.host.roots)
    with locked(ctx):
        runner.detect(ctx)
        runner.verify(ctx)
        return runner.signal(ctx)


def cdi_spec(ctx: Context) -> CdiSpec:
    """The CDI spec for this node as `signal` would write it now (no lock: writes nothing)."""
    from installer.pipeline.cdispec import current_spec

    return current_spec(ctx)


def status(ctx: Context) -> StatusReport:
    from installer.pipeline.status import collect

    return collect(ctx)


def wait_ready(ctx: Context, *, timeout: float, interval: float) -> Readiness:
    from installer.installdir.readiness import wait_ready as wait

    return wait(ctx.config, ctx.host, timeout=timeout, interval=interval)


def uninstall(ctx: Context, *, keep_cache: bool) -> UninstallResult:
    from installer.pipeline import uninstall as remove

    with locked(ctx, claim=False):  # a foreign layout is left as it is, not claimed
        return runner.run_stage(ctx, "uninstall", lambda c: remove.run(c, keep_cache=keep_cache))


def compat(cuda: str, driver: str | None, node: Callable[[], Context]) -> CudaVerdict:
    """Check a CUDA toolkit against `--driver`, else against the driver the node has loaded
    (the node's settings are validated only then)."""
    from installer.compat import toolkit
    from installer.node import kmod

    def loaded_version() -> str | None:
        try:
            host = node().host
        except ConfigError as exc:  # a workstation: the driver to check is the likelier fix
            raise ConfigError(f"no --driver given, and no node's loaded driver to check: "
                              f"{exc.message}",
                              remedy="pass --driver VERSION to check a driver version, or "
                                     "point --host-root at a node's filesystem") from None
        loaded = kmod.loaded_driver(host)
        return loaded.version if loaded else None

    return toolkit.run_check(cuda, driver, loaded_version)
