"""What one round of the agent concluded, what the loop keeps between rounds, and the record
of the Xid Events it posted."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.agent.daemons import RUNNING, Supervised, Supervisor
from installer.errors import VerificationError
from installer.node.gpufabric import GpuFabric
from installer.node.host import write_atomic

XID_EVENTS = "xid-events.json"  # in the work area: the GPU:Xid pairs posted this boot
MAX_XID_RECORD = 256 * 1024


@dataclass(frozen=True)
class Verdict:
    """What a round concluded."""

    ready: bool
    reason: str  # CamelCase, as a condition's reason
    message: str
    gpus: tuple[GpuFabric, ...] = ()

    def to_text(self) -> str:
        lines = [f"{'ready' if self.ready else 'not ready'} ({self.reason}): {self.message}"]
        lines += [f"GPU {g.index}{f' ({g.pci})' if g.pci else ''}: fabric {g.state}"
                  + (f" status {g.status}" if g.status is not None else "")
                  for g in self.gpus]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_view(), indent=2)

    def to_view(self) -> dict[str, Any]:
        return {"ready": self.ready, "reason": self.message, "cause": self.reason,
                "fabric": [{"index": g.index, "pci": g.pci, "state": g.state,
                            "status": g.status} for g in self.gpus]}


class AgentNotReadyError(VerificationError):
    """`agent --once`: the node is not ready (daemons, fabric, or no verified install)."""


@dataclass
class AgentState:
    """What the loop remembers between rounds."""

    started: float
    verdict: Verdict | None = None
    view_written: float = 0.0
    nvml_ready: bool = False
    nvml_error: str | None = None
    trimmed: bool = False


def running(supervisor: Supervisor) -> str:
    return ", ".join(f"{d.spec.name} running" for d in supervisor.daemons if d.state == RUNNING)


def failing_verdict(failing: list[Supervised]) -> Verdict:
    daemon = failing[0]
    lines = " | ".join(daemon.tail[-5:]) or "no output"
    return Verdict(False, "DaemonFailing",
                   f"{daemon.spec.name} keeps failing ({daemon.failures} exits in a row, "
                   f"last exit code {daemon.last_exit}); last lines: {lines}")


def load_announced(work: Path, boot: str) -> set[str]:
    """The GPU:Xid pairs an Event was posted for in this boot (by an earlier agent too: a
    restarted agent re-reads the kernel log and must not post them again)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        document = json.loads((work / XID_EVENTS).read_bytes()[:MAX_XID_RECORD])
        if isinstance(document, dict) and document.get("boot") == boot:
            return {str(pair) for pair in document.get("announced", [])}
    return set()


def save_announced(work: Path, boot: str, announced: set[str]) -> None:
    with contextlib.suppress(OSError):
        write_atomic(work / XID_EVENTS, json.dumps(
            {"boot": boot, "announced": sorted(announced)}).encode())
