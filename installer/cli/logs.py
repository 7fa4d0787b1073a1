"""structlog set-up: JSON lines for machines, readable lines for a person at a terminal.

Logs go to stderr so that command output on stdout (`detect --output json`) stays clean;
the format follows whether stderr is a terminal unless `--log-format` says otherwise.
Each event carries `severity` (what Cloud Logging and most collectors read) and `event`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # structlog is imported when logs are configured: `--help` and the
    from structlog.typing import EventDict, WrappedLogger  # look-only commands never pay it

# the standard library's numeric levels (logging.DEBUG...), without importing logging
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _add_severity(_logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    event["severity"] = "WARNING" if method == "warn" else method.upper()
    return event


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog once per process (tests call it again freely)."""
    import structlog

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
    import structlog

    return structlog.get_logger(**context)
