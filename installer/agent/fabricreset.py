"""The GPU reset after Fabric Manager starts in shared NVSwitch mode on an NVLink5 node.

NVIDIA's driver container resets the GPUs (`nvidia-smi -r`) right after it starts Fabric
Manager on an NVLink5 system whose NVFM_CONFIG_FABRIC_MODE is 1, "to clear stale fabric
partition states" (NVIDIA/gpu-driver-container @ 06a208ca9747c82b1ba99b76ecdcf2469b0a0207,
ubuntu22.04/nvidia-driver, the NVLink5 branch after nvidia-fabricmanager-start.sh; the same
in its other platforms' scripts). The agent does the same once per Fabric Manager process it
started, when that process has survived its start: GPU by GPU through `gpureset` (the
driver's `nvidia-smi -r -i <bus id>`, each bounded by its timeout), each outcome and the
whole reset's duration logged. A Fabric Manager adopted from an earlier agent was reset by
the agent that started it. A GPU that cannot be reset is an Event and a log line, never a
crash: Fabric Manager's own fabric state still decides readiness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.agent.daemons import RUNNING, Supervisor
from installer.node import gpureset, pci
from installer.node.host import Host
from installer.packages.daemons import FABRIC_MANAGER

Event = Callable[[str, str], None]


class FabricModeReset:
    """Resets the GPUs once for each Fabric Manager start it has not reset for yet."""

    def __init__(self, host: Host, install_root: Path, log: Any, event: Event) -> None:
        self.host, self.install_root, self.log, self.event = host, install_root, log, event
        self.done_for: int | None = None  # the start time (ticks) of the process reset for

    def check(self, supervisor: Supervisor) -> None:
        """Reset now if Fabric Manager runs, was started by this agent, and is new."""
        fm = next((d for d in supervisor.daemons if d.spec.name == FABRIC_MANAGER), None)
        if fm is None or fm.state != RUNNING or fm.process is None or fm.start_ticks is None:
            return
        if fm.start_ticks == self.done_for:
            return
        self.done_for = fm.start_ticks
        self.reset_all()

    def reset_all(self) -> None:
        began = time.monotonic()
        gpus = [f.pci_address for f in pci.scan(self.host) if f.kind == pci.KIND_GPU]
        failed = []
        for bus_id in gpus:
            outcome = gpureset.reset_gpu(self.host, bus_id, self.install_root)
            if outcome.error is not None:
                failed.append(f"{bus_id}: {outcome.error}")
        self.log.info("gpus reset for fabric mode", gpus=len(gpus), failed=failed,
                      duration_ms=round((time.monotonic() - began) * 1000))
        if failed:
            self.event("FabricModeResetFailed",
                       f"GPU reset after Fabric Manager started with FABRIC_MODE=1 failed "
                       f"for {len(failed)} of {len(gpus)} GPUs ({failed[0]}); stale fabric "
                       "partition state may remain: drain the node and reset its GPUs")
