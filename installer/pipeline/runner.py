"""The pipeline runner: the one place that runs a stage, times it, logs it, keeps its result.

`run_stage` wraps any step; the six typed steps below run one stage each and put its result
on the `Context` field the next stages read. Stage modules are imported only when run, so
that `import installer.cli` stays cheap (requests and pynvml load only where needed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from installer.context import Context
from installer.errors import InstallerError
from installer.node.interrupts import Signalled

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo
    from installer.packages.manifest import Package
    from installer.stages.load import LoadResult
    from installer.stages.signal import SignalResult
    from installer.stages.stage import StageResult
    from installer.stages.verify import VerifyResult

T = TypeVar("T")


def run_stage(ctx: Context, name: str, fn: Callable[[Context], T]) -> T:
    """Run one step, record its duration, log one event with it.

    A failure is logged once, tagged with the stage's name, and re-raised for the CLI; a
    signal (`installer.node.interrupts`) becomes such a failure here, so that the callers'
    failure paths (restore the previous version, release the lock) run for it too.
    """
    log = ctx.log.bind(stage=name)
    start = time.perf_counter()
    try:
        result = fn(ctx)
    except InstallerError as exc:
        _failed(log, start, exc, name)
        raise
    except Signalled as sig:  # SIGTERM/SIGINT: now an ordinary failure, naming this stage
        error = sig.error(name, f"during the {name} stage")
        _failed(log, start, error, name)
        raise error from None
    duration = _ms_since(start)
    ctx.timings_ms[name] = duration
    log.info("stage finished", duration_ms=duration, **_summary(result))
    return result


def _failed(log: Any, start: float, exc: InstallerError, name: str) -> None:
    exc.stage = exc.stage or name
    log.error("stage failed", duration_ms=_ms_since(start), error=exc.slug,
              exit_code=exc.code, message=exc.message, remedy=exc.remedy)


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 1)


def _summary(result: Any) -> dict[str, Any]:
    """A stage result may offer `log_fields()`: a few key facts for its log event."""
    fields = getattr(result, "log_fields", None)
    return dict(fields()) if callable(fields) else {}


def detect(ctx: Context) -> NodeInfo:
    from installer.stages import detect as stage

    ctx.node = run_stage(ctx, "detect", stage.run)
    return ctx.node


def fetch(ctx: Context, *, reuse: Package | None = None) -> Package:
    """The fetch stage, or (on the fast path) the package the cache already proved whole."""
    if reuse is not None:
        ctx.package = run_stage(ctx, "fetch", lambda _ctx: reuse)
    else:
        from installer.stages import fetch as stage

        ctx.package = run_stage(ctx, "fetch", stage.run)
    return ctx.package


def load(ctx: Context) -> LoadResult:
    from installer.stages import load as stage

    result = run_stage(ctx, "load", stage.run)
    ctx.modules_loaded = True
    ctx.rdma = result.rdma
    ctx.optional = tuple(result.optional)
    return result


def stage(ctx: Context) -> StageResult:
    from installer.stages import stage as stage_room

    return run_stage(ctx, "stage", stage_room.run)


def verify(ctx: Context, *, cuda_smoke: bool = False, lib_dir: Path | None = None,
           gpu_count: int | None = None) -> VerifyResult:
    from installer.stages import verify as stage

    result = run_stage(ctx, "verify", lambda c: stage.verify(
        c, cuda_smoke=cuda_smoke, lib_dir=lib_dir, gpu_count=gpu_count))
    ctx.verified = result
    return result


def signal(ctx: Context) -> SignalResult:
    from installer.stages import signal as stage

    return run_stage(ctx, "signal", stage.run)
