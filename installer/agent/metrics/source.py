"""What the metrics read from the agent, as a protocol.

The agent's loop hands itself to `serving`; the collector reads its settings, log, verdict,
NVML state, daemons and Xid counts through this view. The loop imports the metrics, never
the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from installer.agent.daemons import Supervisor
    from installer.agent.health import Health
    from installer.agent.nextkernel import Said
    from installer.agent.verdict import Verdict
    from installer.config import Config
    from installer.context import Context


class AgentStateView(Protocol):
    """The loop's memory between rounds: the last verdict and why NVML is not ready."""

    @property
    def verdict(self) -> Verdict | None: ...

    @property
    def nvml_error(self) -> str | None: ...


class AgentView(Protocol):
    """The running agent as the metrics see it (read only)."""

    @property
    def ctx(self) -> Context: ...

    @property
    def config(self) -> Config: ...

    @property
    def log(self) -> FilteringBoundLogger: ...

    @property
    def state(self) -> AgentStateView: ...

    @property
    def supervisor(self) -> Supervisor | None: ...

    @property
    def health(self) -> Health: ...

    @property
    def next_said(self) -> Said | None: ...

    def nvml_ready(self) -> bool:
        """NVML bound and initialised (may try again)."""
        ...
