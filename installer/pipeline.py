"""The pipeline runner: the one place that sequences stages, times them and logs them.

A stage is a module with `run(ctx) -> result`. Stage modules are imported only when run,
so that `import installer.cli` stays cheap (requests and pynvml load only where needed).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import __version__
from installer.config import Config
from installer.errors import InstallerError
from installer.host import Host

if TYPE_CHECKING:
    from installer.state import InstallState

STAGE_MODULES: dict[str, str] = {
    "detect": "installer.detect",
    "fetch": "installer.fetch",
    "load": "installer.load",
    "stage": "installer.stage",
    "verify": "installer.verify",
    "signal": "installer.signal",
}
INSTALL_ORDER: tuple[str, ...] = ("detect", "fetch", "load", "stage", "verify", "signal")

StageFn = Callable[["Context"], Any]


@dataclass
class Context:
    """What every stage sees: settings, the host seam, a logger and earlier stages' results."""

    config: Config
    host: Host
    log: Any
    results: dict[str, Any] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)


def stage_function(name: str) -> StageFn:
    """The `run` function of a stage, imported on first use."""
    module = importlib.import_module(STAGE_MODULES[name])
    run: StageFn = module.run
    return run


def run_stage(ctx: Context, name: str, fn: StageFn | None = None) -> Any:
    """Run one stage, store its result, log one event with its duration.

    A failure is logged once, tagged with the stage's name, and re-raised for the CLI.
    """
    stage_fn = fn or stage_function(name)
    log = ctx.log.bind(stage=name)
    start = time.perf_counter()
    try:
        result = stage_fn(ctx)
    except InstallerError as exc:
        exc.stage = exc.stage or name
        log.error("stage failed", duration_ms=_ms_since(start), error=exc.slug,
                  exit_code=exc.code, message=exc.message, remedy=exc.remedy)
        raise
    duration = _ms_since(start)
    ctx.results[name] = result
    ctx.timings_ms[name] = duration
    log.info("stage finished", duration_ms=duration, **_summary(result))
    return result


def run_stages(ctx: Context, names: Sequence[str]) -> dict[str, Any]:
    """Run stages in order, stopping at the first failure (its exception carries the code)."""
    for name in names:
        run_stage(ctx, name)
    return ctx.results


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 1)


def _summary(result: Any) -> dict[str, Any]:
    """A stage result may offer `log_fields()`: a few key facts for its log event."""
    fields = getattr(result, "log_fields", None)
    return dict(fields()) if callable(fields) else {}


LOCK_FILE = ".lock"


@dataclass(frozen=True)
class InstallResult:
    """What `install` did, for the log, the human report and `--output json`."""

    fast_path: bool
    driver_version: str
    kernel_release: str
    flavour: str
    package_digest: str
    timings_ms: dict[str, float]

    def log_fields(self) -> dict[str, Any]:
        return {"fast_path": self.fast_path, "driver": self.driver_version,
                "total_ms": round(sum(self.timings_ms.values()), 1)}

    def to_json(self) -> str:
        import json
        from dataclasses import asdict

        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        path = "fast path (nothing downloaded or copied)" if self.fast_path else "full install"
        lines = [f"Installed NVIDIA {self.driver_version} ({self.flavour}) for kernel "
                 f"{self.kernel_release}: {path}"]
        lines += [f"  {name:<8} {ms:>9.1f} ms" for name, ms in self.timings_ms.items()]
        return "\n".join(lines)


def install(ctx: Context, *, paranoid: bool = False) -> InstallResult:
    """The DaemonSet's job: lock, then every stage in order, never leaving a half install.

    Readiness is withdrawn first and written last; on failure the previous version, when it
    is still what is staged and loaded, is re-verified and declared ready again.
    """
    from installer import detect, signal
    from installer.lock import node_lock
    from installer.state import read_state

    detect.require_gpus(run_stage(ctx, "detect"))  # read-only: a GPU-less node gets nothing
    root = ctx.host.roots.node(ctx.config.install_dir)

    def waiting(pid: int | None) -> None:
        ctx.log.info("waiting for the node lock", holder_pid=pid)

    with node_lock(root / LOCK_FILE, timeout=ctx.config.lock_timeout, on_wait=waiting):
        previous = read_state(root)
        readiness = {path: path.read_bytes() for path in signal.ready_paths(ctx)
                     if path.is_file()}
        signal.clear_readiness(ctx)
        try:
            return _install_locked(ctx, root, previous, paranoid=paranoid)
        except InstallerError:
            _restore_previous(ctx, previous, readiness)
            raise


def _install_locked(ctx: Context, root: Path, previous: InstallState | None, *,
                    paranoid: bool) -> InstallResult:
    from installer import fastpath, stage
    from installer.state import InstallState, write_state

    node = ctx.results["detect"]
    reused = fastpath.reusable_package(ctx, node, previous, paranoid=paranoid)
    package = run_stage(ctx, "fetch", (lambda _ctx: reused) if reused else None)
    run_stage(ctx, "prepare", lambda c: stage.prepare_version(c, package))
    for name in ("load", "stage", "verify"):
        run_stage(ctx, name)
    manifest = package.manifest
    write_state(root, InstallState(
        installer_version=__version__, requested_version=ctx.config.driver_version,
        flavour_requested=ctx.config.flavour, kernel_release=manifest.kernel_release,
        driver_version=manifest.driver_version, flavour=manifest.flavour,
        package_digest=package.digest, timings_ms=dict(ctx.timings_ms)))
    run_stage(ctx, "signal")
    return InstallResult(reused is not None, manifest.driver_version, manifest.kernel_release,
                         manifest.flavour, package.digest, dict(ctx.timings_ms))


def _restore_previous(ctx: Context, previous: InstallState | None,
                      readiness: dict[Path, bytes]) -> None:
    """After a failure, put the old version back in service if it is still intact.

    Possible only while the kernel still runs the old driver and its staged directory is
    whole: then the links are switched back (if the new version was switched to) and the
    readiness files that its verified install wrote are restored. NVML is not asked again:
    a process cannot load a second libnvidia-ml.so.1 once one is loaded.
    """
    from installer import fastpath, kmod, stage
    from installer.host import write_atomic

    loaded = kmod.loaded_driver(ctx.host)
    if (previous is None or not readiness or loaded is None
            or loaded.version != previous.driver_version):
        return
    root = stage.install_root(ctx)
    name = f"{previous.driver_version}-{previous.kernel_release}-{previous.flavour}"
    meta = stage.read_staged(root, name) or {}
    package = fastpath.cached(ctx, previous.package_digest, verify=False)
    if (meta.get("digest") != previous.package_digest or package is None
            or not fastpath.staged_intact(ctx, package, paranoid=False)):
        ctx.log.warning("previous version not restored", reason="no longer staged intact")
        return
    try:
        if stage.current_name(root) != name:
            stage.switch_to(root, name)
        for path, data in readiness.items():
            write_atomic(path, data)
    except OSError as exc:
        ctx.log.warning("previous version not restored", reason=str(exc))
        return
    ctx.log.warning("previous version still serving", driver=previous.driver_version)
