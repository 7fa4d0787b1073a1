"""structlog set-up: JSON lines for machines, readable lines for a person at a terminal.

Logs go to stderr so that command output on stdout (`detect --output json`) stays clean;
the format follows whether stderr is a terminal unless `--log-format` says otherwise.
Each event carries `severity` (what Cloud Logging and most collectors read) and `event`.

structlog is imported without what the installer never runs, since the node agent lives as
long as the pod and its RSS is what every GPU node pays: `rich`, which structlog.dev imports
when installed (the dev virtualenv has it; the image does not) only to render tracebacks,
which `format_exc_info` below has already rendered as text; and `asyncio` (about 4 MB with
its submodules), which structlog imports for its async log methods (`ainfo`...) that the
installer never calls: structlog gets a stand-in that imports it on first use.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # structlog is imported when logs are configured: `--help` and the
    from structlog.typing import EventDict, WrappedLogger  # look-only commands never pay it

# the standard library's numeric levels (logging.DEBUG...), without importing logging
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _add_severity(_logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    event["severity"] = "WARNING" if method == "warn" else method.upper()
    return event


class _OnFirstUse(ModuleType):
    """Stands in for a module inside structlog's own modules: the first attribute used
    imports the real one (as any other importer gets it) and every use goes there."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attr)


def import_structlog() -> ModuleType:
    """structlog, with `rich` kept out and `asyncio` deferred (see the module's docstring)."""
    if "structlog" in sys.modules:
        return sys.modules["structlog"]
    stand_ins: dict[str, ModuleType | None] = {}
    if "rich" not in sys.modules:
        stand_ins["rich"] = None  # structlog.dev's `try: import rich` gets ImportError
    if "asyncio" not in sys.modules:
        stand_ins["asyncio"] = _OnFirstUse("asyncio")
    sys.modules.update(stand_ins)  # type: ignore[arg-type]
    try:
        import structlog
    finally:
        for name, stand_in in stand_ins.items():  # anyone else imports the real ones
            if sys.modules.get(name, ...) is stand_in:
                del sys.modules[name]
    return structlog


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog once per process (tests call it again freely)."""
    structlog = import_structlog()

    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: Any = (structlog.processors.JSONRenderer(sort_keys=False) if use_json
                     else structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_severity,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    """A bound logger; `stage=` and other context ride along on every event."""
    return import_structlog().get_logger(**context)
