"""`install`, the DaemonSet's job: every stage in order under the node lock, never leaving a
half install, with the reboot fast path and the restore of the previous version on failure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import __version__
from installer.compat.nodelabels import UPGRADE_SKIP
from installer.context import Context
from installer.errors import DiskFullError, InstallerError
from installer.installdir import ownership, skipped
from installer.installdir.daemons import package_daemons, require_daemons
from installer.installdir.lastrun import LastInstall, write_last_install
from installer.installdir.layout import lock_path, version_name
from installer.installdir.readiness import ready_paths
from installer.installdir.state import InstallState, read_state, write_state
from installer.installdir.versions import current_name, read_staged, switch_to
from installer.node import kmod
from installer.node.host import write_atomic
from installer.node.lock import node_lock
from installer.packages.manifest import Package
from installer.pipeline import fastpath, partition, runner
from installer.stages.detect import require_gpus

if TYPE_CHECKING:
    from installer.upgrade.skip import Skipped
    from installer.upgrade.versionmap import Choice


@dataclass(frozen=True)
class InstallResult:
    """What `install` did, for the log, the human report and `--output json`."""

    fast_path: bool
    driver_version: str
    kernel_release: str
    flavour: str
    package_digest: str
    timings_ms: dict[str, float]
    skipped: dict[str, str] | None = None  # upgrade.skip kept the loaded driver: both named

    def log_fields(self) -> dict[str, Any]:
        return {"fast_path": self.fast_path, "driver": self.driver_version,
                "skipped": self.skipped is not None,
                "total_ms": round(sum(self.timings_ms.values()), 1)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        if self.skipped:
            return (f"Kept NVIDIA {self.skipped['serving']}: wanted {self.skipped['wanted']}, "
                    f"skipped by label {self.skipped['label']}")
        path = "fast path (nothing downloaded or copied)" if self.fast_path else "full install"
        lines = [f"Installed NVIDIA {self.driver_version} ({self.flavour}) for kernel "
                 f"{self.kernel_release}: {path}"]
        lines += [f"  {name:<8} {ms:>9.1f} ms" for name, ms in self.timings_ms.items()]
        return "\n".join(lines)


def install(ctx: Context, *, paranoid: bool = False) -> InstallResult:
    """Lock, then every stage in order.

    Readiness is withdrawn only once the run changes the driver (the load stage, after the
    skip label and the live upgrade's plan said go) and written last; on failure the previous
    version, when it is still what is staged and loaded, is declared ready again.
    """
    choice = _choose_version(ctx)  # DRIVER_VERSION_MAP: a bad map is refused before any write
    require_gpus(runner.detect(ctx))  # read-only: a GPU-less node gets nothing written

    def waiting(pid: int | None) -> None:
        ctx.log.info("waiting for the node lock", holder_pid=pid)

    roots = ctx.host.roots
    ownership.guard(ctx.config, roots)  # before the lock file: refuse a dir not ours
    ownership.guard_cdi(ctx.config, roots)  # and a CDI spec dir that cannot be one
    with node_lock(lock_path(ctx.config, roots), timeout=ctx.config.lock_timeout,
                   on_wait=waiting):
        ownership.claim(ctx.config, roots, ctx.log.warning)
        previous = read_state(ctx.install_root, ctx.log)
        readiness = {path: path.read_bytes() for path in ready_paths(ctx.config, roots)
                     if path.is_file()}
        try:
            result = _install_locked(ctx, previous, paranoid=paranoid)
        except InstallerError as exc:
            if exc.stage != "partition":  # a GPU not as configured is never made ready
                _restore_previous(ctx, previous, readiness)
            write_last_install(ctx.install_root, LastInstall(
                exc.code, fast_path=False, stage=exc.stage or "",
                timings_ms=dict(ctx.timings_ms)))
            raise
        write_last_install(ctx.install_root, LastInstall(
            0, fast_path=result.fast_path, timings_ms=dict(result.timings_ms)))
    if choice is not None and result.skipped is None:
        from installer.upgrade import versionmap

        versionmap.label(ctx, choice)
    return result


def _choose_version(ctx: Context) -> Choice | None:
    """The map's choice made this run's requested version (installer.upgrade.versionmap,
    imported only with a map: the fast path of a node without one needs no API)."""
    if ctx.config.driver_version_map is None:
        return None
    from installer.upgrade import versionmap

    return versionmap.apply(ctx)


def _install_locked(ctx: Context, previous: InstallState | None, *,
                    paranoid: bool) -> InstallResult:
    from installer.stages import stage

    reused = fastpath.reusable_package(ctx, ctx.node_info(), previous, paranoid=paranoid)
    package = runner.fetch(ctx, reuse=reused)
    kept = _skipped(ctx, package)
    if kept is not None:
        return _kept_result(ctx, package, kept)
    skipped.forget(ctx.config, ctx.host.roots)
    manifest = package.manifest  # a fabric node needs its daemons: refuse before any change
    if ctx.config.fabric_manager == "package":
        require_daemons(ctx.node_info().fabric.kind,
                        package_daemons(ctx.config, ctx.host.roots, manifest),
                        manifest.driver_version)
    runner.run_stage(ctx, "prepare", lambda c: stage.prepare_version(c, package))
    if ctx.config.upgrade_policy == "refuse":  # today's behaviour: no Kubernetes client
        _load_to_signal(ctx, package)
    else:
        _live_upgrade(ctx, package)
    return InstallResult(reused is not None, manifest.driver_version, manifest.kernel_release,
                         manifest.flavour, package.digest, dict(ctx.timings_ms))


def _skipped(ctx: Context, package: Package) -> Skipped | None:
    """The Node's upgrade.skip label, read before anything is prepared or withdrawn, only
    when another driver serves (installer.upgrade.skip; its client is imported only then)."""
    from installer.stages import load

    if kmod.loaded_driver(ctx.host) is None or load.other_version(ctx.host, package) is None:
        return None
    from installer.upgrade import skip

    return skip.check(ctx, package)


def _kept_result(ctx: Context, package: Package, kept: Skipped) -> InstallResult:
    """The driver that keeps serving (no package was installed: no digest)."""
    loaded = kmod.loaded_driver(ctx.host)
    manifest = package.manifest
    return InstallResult(False, loaded.version if loaded else kept.serving,
                         manifest.kernel_release, (loaded and loaded.flavour) or manifest.flavour,
                         "", dict(ctx.timings_ms),
                         skipped={"wanted": kept.wanted, "serving": kept.serving,
                                  "label": UPGRADE_SKIP})


def _live_upgrade(ctx: Context, package: Package) -> None:
    """UPGRADE_POLICY evict/drain: free the GPUs first, then install, then uncordon
    (docs/upgrading.md). Imported only here: the Kubernetes client, which the
    reboot fast path of a `refuse` node never needs."""
    from installer.upgrade import flow as upgrade

    live = runner.run_stage(ctx, "upgrade", lambda c: upgrade.free_gpus(c, package))
    try:
        _load_to_signal(ctx, package)
    except InstallerError as exc:
        upgrade.failed(live, exc)
        raise
    upgrade.finish(ctx, live)


def _load_to_signal(ctx: Context, package: Package) -> None:
    runner.load(ctx)
    runner.stage(ctx)
    runner.verify(ctx)
    manifest = package.manifest
    write_state(ctx.install_root, InstallState(
        installer_version=__version__, requested_version=ctx.config.driver_version,
        flavour_requested=ctx.config.flavour, kernel_release=manifest.kernel_release,
        driver_version=manifest.driver_version, flavour=manifest.flavour,
        package_digest=package.digest, timings_ms=dict(ctx.timings_ms)))
    partition.partition(ctx)  # MIG, when configured: readiness only after it succeeded
    runner.signal(ctx)


def _restore_previous(ctx: Context, previous: InstallState | None,
                      readiness: dict[Path, bytes]) -> None:
    """After a failure, put the old version back in service if it is still intact.

    Possible only while the kernel still runs the old driver and its staged directory is
    whole: then the links are switched back (if the new version was switched to) and the
    readiness files that its verified install wrote are restored. NVML is not asked again:
    a process cannot load a second libnvidia-ml.so.1 once one is loaded.
    """
    loaded = kmod.loaded_driver(ctx.host)
    if (previous is None or not readiness or loaded is None
            or loaded.version != previous.driver_version):
        return
    root = ctx.install_root
    name = version_name(previous)
    meta = read_staged(root, name) or {}
    package = fastpath.cached(ctx, previous.package_digest, verify=False)
    if (meta.get("digest") != previous.package_digest or package is None
            or not fastpath.staged_intact(ctx, package, paranoid=False)):
        ctx.log.warning("previous version not restored", reason="no longer staged intact")
        return
    try:
        if current_name(root) != name:
            switch_to(root, name)
        for path, data in readiness.items():
            if not path.is_file() or path.read_bytes() != data:  # a refusal withdrew nothing
                write_atomic(path, data)
    except (OSError, DiskFullError) as exc:
        ctx.log.warning("previous version not restored", reason=str(exc))
        return
    ctx.log.warning("previous version still serving", driver=previous.driver_version)
