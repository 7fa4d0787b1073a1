"""The pipeline runner: the one place that sequences stages, times them and logs them.

A stage is a module with `run(ctx) -> result`. Stage modules are imported only when run,
so that `import installer.cli` stays cheap (requests and pynvml load only where needed).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from installer.config import Config
from installer.errors import InstallerError
from installer.host import Host

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
