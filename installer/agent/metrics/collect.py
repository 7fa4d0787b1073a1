"""The collector: on the agent's schedule (every METRICS_INTERVAL), one NVML pass and one
PodResources `List`, plus what the agent and the install already know, into a new snapshot.

It runs on its own thread so that a slow NVML or kubelet never delays a readiness round,
and a scrape never waits for either. Everything it reads from the agent is either
immutable (the verdict) or a plain counter copied under the GIL.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from installer.agent.daemons import RUNNING
from installer.agent.metrics.gpm import GpmReader
from installer.agent.metrics.nvml import NvmlReader, PassResult
from installer.agent.metrics.snapshot import InstallFacts, Snapshot
from installer.agent.metrics.source import AgentView
from installer.installdir.lastrun import read_last_install
from installer.installdir.state import read_state
from installer.node.podresources import Assignment, PodResourcesUnavailable, list_assignments


class Collector:
    """Builds snapshots; `latest` is swapped in one assignment (readers need no lock)."""

    def __init__(self, agent: AgentView, clock: Callable[[], float] = time.time,
                 wait: Callable[[float], object] = time.sleep) -> None:
        """`wait` sleeps between a GPU's two GPM samples (the agent's stop event's wait)."""
        self.agent, self.clock = agent, clock
        interval = agent.config.metrics_gpm_interval
        gpm = GpmReader(agent.log, interval, wait) if interval > 0 else None
        self.nvml = NvmlReader(agent.log, clock, gpm)
        self.errors: Counter[str] = Counter()
        self.pod_reason: str | None = None  # the last "why no per-container view", logged
        self.latest = Snapshot(taken_at=clock(), node_name=agent.config.node_name or "")

    def collect(self) -> Snapshot:
        """One collection; never raises (a failing source is counted and left out)."""
        gpus = self._nvml()
        for source, message in gpus.failures:
            self.errors[source] += 1
            self.agent.log.debug("metrics read failed", source=source, detail=message)
        snap = Snapshot(
            taken_at=self.clock(), node_name=self.agent.config.node_name or "",
            install=self._install(gpus.cuda_version), ready=self._ready(),
            daemons=self._daemons(), fabric=self._fabric(), xids=self._xids(),
            last_xids=tuple(sorted(dict(self.agent.health.last).items())),
            driver_version=gpus.driver_version, gpus=tuple(gpus.gpus),
            unreadable=tuple(gpus.unreadable), containers=self._containers(),
            errors=tuple(sorted(self.errors.items())), next_kernel=self._next_kernel())
        self.latest = snap
        return snap

    def _nvml(self) -> PassResult:
        if not self.agent.nvml_ready():
            return PassResult(failures=[("nvml", self.agent.state.nvml_error or "no NVML")])
        return self.nvml.read()

    def _install(self, cuda: str) -> InstallFacts:
        root = self.agent.ctx.install_root
        try:
            state, last = read_state(root), read_last_install(root)
        except Exception as exc:  # a metric source, never the agent's end
            self.errors["install"] += 1
            self.agent.log.debug("metrics read failed", source="install", detail=str(exc))
            return InstallFacts(cuda_version=cuda)
        timings = last.timings_ms if last is not None else (state.timings_ms if state else {})
        return InstallFacts(
            driver_version=state.driver_version if state else "",
            flavour=state.flavour if state else "", kernel=state.kernel_release if state else "",
            cuda_version=cuda, package_digest=state.package_digest if state else "",
            exit_code=last.exit_code if last else None,
            fast_path=last.fast_path if last else None,
            stage_seconds={k: v / 1000.0 for k, v in timings.items()})

    def _ready(self) -> bool | None:
        verdict = self.agent.state.verdict
        return None if verdict is None else verdict.ready

    def _next_kernel(self) -> tuple[str, str] | None:
        said = self.agent.next_said  # one reference, swapped whole by the loop
        return (said.kernel, said.state) if said is not None else None

    def _daemons(self) -> tuple[tuple[str, bool, int], ...]:
        supervisor = self.agent.supervisor
        if supervisor is None:
            return ()
        return tuple((d.spec.name, d.state == RUNNING, d.restarts)
                     for d in list(supervisor.daemons))

    def _fabric(self) -> tuple[tuple[int, str], ...]:
        verdict = self.agent.state.verdict
        return tuple((g.index, g.state) for g in verdict.gpus) if verdict else ()

    def _xids(self) -> tuple[tuple[str, int, int], ...]:
        counts = {gpu: dict(c) for gpu, c in list(self.agent.health.counts.items())}
        return tuple((gpu, code, n) for gpu, codes in sorted(counts.items())
                     for code, n in sorted(codes.items()))

    def _containers(self) -> tuple[Assignment, ...] | None:
        try:
            found = tuple(list_assignments(self.agent.config.pod_resources_dir))
        except PodResourcesUnavailable as exc:
            self.errors["podresources"] += 1
            self._say(str(exc))
            return None
        self._say(None)
        return found

    def _say(self, reason: str | None) -> None:
        """One line per change of the per-container view's availability."""
        if reason == self.pod_reason:
            return
        if reason is None:
            self.agent.log.info("per-container GPU metrics available (kubelet PodResources)")
        else:
            self.agent.log.warning("per-container GPU metrics absent", reason=reason)
        self.pod_reason = reason


def run(collector: Collector, stop: threading.Event, interval_s: float, log: Any) -> None:
    """Collect every `interval_s` until `stop` is set (the first at once)."""
    while not stop.is_set():
        try:
            collector.collect()
        except Exception as exc:  # a bug here must not end the thread
            log.error("metrics collection failed", detail=repr(exc))
        stop.wait(interval_s)
