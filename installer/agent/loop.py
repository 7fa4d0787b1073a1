"""The agent's loop: one round decides readiness; between rounds it waits on the GPU health
source (Xid events) or a >= 5 s interval, never busy-polls.

A round: the supervisor reaps and (re)starts daemons; the verdict is computed from the
daemons, the InfiniBand modules (NVLink5) and every GPU's fabric state (NVML); readiness is
withdrawn or published (the install's held bytes) and the probe's view written in the
round itself; the cluster hears of changes only, through a queue that never blocks the
round (`installer.agent.publish`). Between rounds the loop also wakes when a daemon exits.
Off a fabric, a daemon's first start is no failure: for its first START_GRACE_S it counts
as up, so an agent's start (or a rollout) never withdraws readiness; only an exit does.
SIGTERM (the kubelet deleting the pod) is only noted by its handler (as
`installer.node.interrupts` does); the loop then stops the daemons through their pid files
and leaves readiness as the node really is: on a fabric node, without Fabric Manager, not
ready. Beside the loop, for its whole life (not `--once`), the metrics server
(`installer.agent.metrics`) collects and serves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from installer.agent import health, metrics, versionwatch
from installer.agent.daemons import (
    FABRIC_DAEMONS,
    STARTING,
    WAITING,
    Supervised,
    Supervisor,
)
from installer.agent.fabricreset import FabricModeReset
from installer.agent.nextkernel import NextKernel, Said
from installer.agent.plan import Plan, make_plan
from installer.agent.process import stop_on_signal, trim_heap
from installer.agent.readiness import HEARTBEAT_S, Keeper, remove_view, work_dir, write_view
from installer.agent.report import Reporter
from installer.agent.verdict import (
    AgentNotReadyError,
    AgentState,
    Verdict,
    failing_verdict,
    load_announced,
    running,
    save_announced,
)
from installer.context import Context
from installer.installdir.layout import install_root
from installer.node import kmod, kmsg
from installer.node.fabric import missing_ib_modules
from installer.node.gpufabric import (
    GpuFabric,
    fabric_done,
    fabric_summary,
    not_done,
    not_done_detail,
    read_fabric,
)

ONCE_START_S = 10.0  # `--once` off a fabric: the daemons' start (START_S), a retry or two
START_GRACE_S = 10.0  # off a fabric: a daemon's first start counts as up for this long
WAKE_S = 0.5  # between rounds, a daemon's exit is looked for this often


class Agent:
    """One node's agent: plan, supervise, decide, report."""

    def __init__(self, ctx: Context, environ: Mapping[str, str],
                 clock: Callable[[], float] = time.monotonic,
                 choose: Callable[[], versionwatch.Choice] | None = None) -> None:
        self.ctx, self.config, self.host, self.log = ctx, ctx.config, ctx.host, ctx.log
        self.environ, self.clock = environ, clock
        self.keeper = Keeper(self.config, self.host)
        self.reporter = Reporter(self.config, self.log)
        self.state = AgentState(started=clock())
        self.work = work_dir(self.config, self.host)
        self.plan: Plan | None = None
        self.supervisor: Supervisor | None = None
        self.fabric_reset: FabricModeReset | None = None  # NVLink5 with FABRIC_MODE=1
        self.no_install: str | None = None
        self.health = health.Health(health.critical_set(self.config))  # Xid counts
        self.start_grace = True  # `--once` confirms the daemons run: no grace there
        self.next_kernel: NextKernel | None = None  # the loop's (not `--once`), when on
        self.versions = (versionwatch.VersionWatch(ctx.install_root, choose, self.log, clock)
                         if choose is not None and ctx.config.driver_version_map else None)

    def prepare(self) -> Plan:
        """Refuse bad settings and packages (exit 2, 14) before anything starts."""
        loaded = kmod.loaded_driver(self.host)
        driver = loaded.version if loaded is not None else ""
        self.no_install = self._capture()
        plan = make_plan(self.config, self.host, driver_version=driver, work=self.work,
                         environ=self.environ)
        self.plan = plan
        self.supervisor = Supervisor(
            self.host, list(plan.specs), work=self.work, log=self.log,
            missing_ib=lambda: missing_ib_modules(self.host), env=plan.env)
        self.supervisor.adopt()
        self.fabric_reset = FabricModeReset(
            self.host, self.ctx.install_root, self.log,
            lambda reason, message: self.reporter.event(reason, message, once_key=reason)
        ) if plan.fabric_mode_reset else None
        self.log.info("agent planned", fabric=plan.kind,
                      daemons=[s.name for s in plan.specs], notes=list(plan.notes))
        return plan

    def _capture(self) -> str | None:
        """Keep the install's readiness; why there is none to keep, if so."""
        if kmod.loaded_driver(self.host) is None:
            return "no NVIDIA kernel module is loaded"
        return self.keeper.capture()

    def round(self) -> Verdict:
        """One round: supervise, decide, apply."""
        assert self.supervisor is not None and self.plan is not None
        now = self.clock()
        self.supervisor.tick(now)
        if self.fabric_reset is not None:
            self.fabric_reset.check(self.supervisor)
        verdict = self._decide(now)
        said_changed = self.next_kernel is not None and self.next_kernel.round(
            now, self.reporter.next_kernel)
        self._apply(verdict, now, view_changed=said_changed)
        changed = self.versions.check() if self.versions is not None else None
        if changed is not None:
            versionwatch.act(changed, self.config, self.reporter, self.log, self.environ)
        return verdict

    @property
    def next_said(self) -> Said | None:
        """The next kernel as last said (None: none, or not watched)."""
        return self.next_kernel.said if self.next_kernel is not None else None

    def _decide(self, now: float) -> Verdict:
        assert self.supervisor is not None and self.plan is not None
        # every round: a rerun may hold new bytes, a failed one none, a driver swapped
        # under the agent makes them not its readiness
        self.no_install = self._capture()
        if self.no_install is not None:
            return Verdict(False, "NotInstalled",
                           f"the install has not made this node ready: {self.no_install}")
        refused = self.supervisor.refused()
        if refused:
            message = f"{refused[0].spec.name} not started: {refused[0].refused}"
            self.reporter.event("DaemonRefused", message,
                                once_key=f"refused:{refused[0].spec.name}")
            return Verdict(False, "DaemonRefused", message)
        failing = self.supervisor.failing()
        if failing:
            verdict = failing_verdict(failing)
            self.reporter.event("DaemonFailing", verdict.message,
                                once_key=f"failing:{failing[0].spec.name}")
            return verdict
        down = [d for d in self.supervisor.down() if not self._starting_up(d, now)]
        waiting = [d for d in down if d.state == WAITING]
        if waiting:
            return self._ib_verdict(now)
        if down:
            daemon = down[0]
            if daemon.state == STARTING:
                return Verdict(False, "DaemonStarting", f"{daemon.spec.name} is starting")
            code = f" (exit code {daemon.last_exit})" if daemon.last_exit is not None else \
                f" ({daemon.tail[-1]})" if daemon.tail else ""  # it could not even start
            return Verdict(False, "DaemonDown",
                           f"{daemon.spec.name} is not running{code}; restarting")
        if not self.plan.fabric:
            return Verdict(True, "Ready", "driver ready; "
                           f"{running(self.supervisor) or 'no daemons needed'}")
        return self._fabric_verdict(now)

    def _starting_up(self, daemon: Supervised, now: float) -> bool:
        """Off a fabric, a daemon in its first start (no failure yet) counts as up for
        START_GRACE_S from when the supervisor started it: readiness stays."""
        return (self.start_grace and not self.plan_fabric() and daemon.state == STARTING
                and not daemon.failures and now - daemon.started_at < START_GRACE_S)

    def plan_fabric(self) -> bool:
        return self.plan is not None and self.plan.fabric

    def _ib_verdict(self, now: float) -> Verdict:
        missing = ", ".join(missing_ib_modules(self.host)) or "the InfiniBand modules"
        waited = now - self.state.started
        if waited >= self.config.fabric_timeout:
            message = f"{missing} not loaded after {waited:.0f}s: NVLSM and Fabric Manager " \
                      "cannot start (load the InfiniBand driver, e.g. MLNX_OFED/DOCA)"
            self.reporter.event("InfiniBandModulesMissing", message, once_key="ib")
            return Verdict(False, "InfiniBandModulesMissing", message)
        return Verdict(False, "WaitingForInfiniBand",
                       f"waiting for {missing} before NVLSM and Fabric Manager "
                       f"({waited:.0f}s of FABRIC_TIMEOUT={self.config.fabric_timeout:g}s)")

    def _fabric_verdict(self, now: float) -> Verdict:
        try:
            gpus = self._read_fabric()
        except Exception as exc:  # NVML failing is a not-ready node, never a crash
            return Verdict(False, "NvmlError", f"cannot read the GPUs' fabric state: {exc}")
        summary = fabric_summary(gpus)
        if fabric_done(gpus):
            return Verdict(True, "Ready", f"fabric complete: {summary}", tuple(gpus))
        waited = now - self._fabric_since()
        detail = f"not done: {not_done_detail(gpus)}" if not_done(gpus) else "no GPUs"
        if waited >= self.config.fabric_timeout:
            message = (f"fabric not complete after {waited:.0f}s "
                       f"(FABRIC_TIMEOUT={self.config.fabric_timeout:g}): {summary}; {detail}")
            self.reporter.event("FabricNotReady", message, once_key="fabric")
            return Verdict(False, "FabricTimeout", message, tuple(gpus))
        return Verdict(False, "FabricInProgress",
                       f"waiting for the fabric: {summary}; {detail}", tuple(gpus))

    def _fabric_since(self) -> float:
        """When the fabric daemons were last (re)started: FABRIC_TIMEOUT counts from there
        (from the agent's start for daemons it found running)."""
        assert self.supervisor is not None
        starts = [d.started_at for d in self.supervisor.daemons
                  if d.spec.name in FABRIC_DAEMONS and d.process is not None]
        return max(starts, default=self.state.started)

    def _read_fabric(self) -> list[GpuFabric]:
        if not self.nvml_ready():
            raise RuntimeError(self.state.nvml_error or "NVML is not initialised")
        return read_fabric()

    def nvml_ready(self) -> bool:
        """NVML bound to the staged library and initialised (tried again each call until
        it works: the driver may be mid-load)."""
        if self.state.nvml_ready:
            return True
        import ctypes

        import pynvml  # type: ignore[import-untyped]

        library = install_root(self.config, self.host.roots) / "lib64" / "libnvidia-ml.so.1"
        try:
            # the staged file, by path: pynvml's own CDLL("libnvidia-ml.so.1") then finds it
            # loaded under that SONAME (the verify stage's bind_library would import the
            # whole stage into a process that lives as long as the pod)
            ctypes.CDLL(str(library))
            pynvml.nvmlInit()
        except (OSError, pynvml.NVMLError) as exc:
            self.state.nvml_error = f"NVML: {exc}"
            return False
        self.state.nvml_ready = True
        return True

    def _apply(self, verdict: Verdict, now: float, *, view_changed: bool = False) -> None:
        """Files first (readiness, the probe's view), in this round; then queue what the
        cluster hears, on a change only (the queue never blocks: `publish`)."""
        previous = self.state.verdict
        changed = previous is None or (previous.ready, previous.reason) != (
            verdict.ready, verdict.reason)
        published = False
        if verdict.ready and not self.keeper.present():
            self.keeper.restore()
            published = True
        elif not verdict.ready and self.no_install is None and self.keeper.present():
            self.keeper.withdraw()
        if changed or view_changed or now - self.state.view_written >= HEARTBEAT_S:
            assert self.supervisor is not None and self.plan is not None
            said = self.next_said
            write_view(self.config, self.host, {
                **verdict.to_view(), "fabric_kind": self.plan.kind,
                **({} if self.next_kernel is None else {  # absent: not watched
                    "next_kernel": said.to_view() if said is not None else None}),
                "daemons": {d.spec.name: d.describe() for d in self.supervisor.daemons}})
            self.state.view_written = now
        self.state.verdict = verdict
        if changed:
            log = self.log.info if verdict.ready else self.log.warning
            log("node ready" if verdict.ready else "node not ready", cause=verdict.reason,
                detail=verdict.message,
                gpus=[f"{g.index}:{g.state}" for g in verdict.gpus] or None)
            self.reporter.verdict(ready=verdict.ready, reason=verdict.reason,
                                  message=verdict.message)
            if verdict.ready:
                self.reporter.rearm()
        if published and self.plan_fabric() and self.keeper.saved is not None:
            self.reporter.event("DriverReady", f"NVIDIA driver {self.keeper.saved.driver_version}"
                                f" ready on {self.keeper.saved.gpus} GPU(s): readiness "
                                f"published, {verdict.message}", warning=False)

    def wait(self, timeout_s: float, wait_once: Callable[[float], object],
             stop: threading.Event | None = None) -> None:
        """Wait up to `timeout_s` in slices of WAKE_S (`wait_once` waits one slice, for
        Xids), ending early when a daemon exited (its readiness goes in the next round) or
        `stop` is set."""
        assert self.supervisor is not None
        end = self.clock() + timeout_s
        while True:
            left = end - self.clock()
            if left <= 0:
                return
            wait_once(min(WAKE_S, left))
            if self.supervisor.any_exited() or (stop is not None and stop.is_set()):
                return

    def wait_s(self) -> float:
        """How long the loop may wait before the next round."""
        assert self.supervisor is not None
        wait = self.config.agent_interval
        due = self.supervisor.next_due()
        if due is not None:
            wait = min(wait, max(0.0, due - self.clock()))
        return max(wait, 0.05)  # a due transition (a restart, a start confirmed) sooner

    def stop(self, *, only_started: bool = False) -> list[str]:
        """Stop the daemons; on a fabric node readiness goes with Fabric Manager."""
        assert self.supervisor is not None and self.plan is not None
        stopped = self.supervisor.stop_all(self.config.daemon_stop_timeout,
                                           only_started=only_started)
        if self.plan.fabric and "nv-fabricmanager" in stopped and self.keeper.present():
            self.keeper.withdraw()
            self.reporter.verdict(ready=False, reason="AgentStopped",
                                  message="the agent stopped Fabric Manager (pod deleted)")
        return stopped


def run_forever(agent: Agent, stop: threading.Event) -> Verdict | None:
    """Rounds until `stop` is set; between rounds, wait on Xid events (`health`'s source:
    NVML events, else /dev/kmsg, else a plain sleep) for at most `Agent.wait_s`."""
    config, api = agent.config, agent.reporter.api
    boot = kmsg.boot_id(agent.host)
    if api is not None:  # queued: a hung API server must not delay the first round
        agent.reporter.queue.put("xid-clear", "clear an earlier boot's Xid condition",
                                 lambda: health.clear_after_reboot(api, config.node_name or "",
                                                                   boot))
    watched = agent.health
    announced = load_announced(agent.work, boot)  # from here on, the API writer's alone

    def send(what: str, call: Callable[[], None]) -> None:
        def report() -> None:
            call()
            save_announced(agent.work, boot, announced)
        agent.reporter.queue.put("xid-report", what, report)

    source = health.open_xid_source(agent.host, use_nvml=agent.nvml_ready())
    if config.next_kernel_prepare == "on":
        agent.next_kernel = NextKernel(config, agent.host, agent.environ, agent.log,
                                       work=agent.work)
    verdict = None
    try:
        while not stop.is_set():
            verdict = agent.round()
            if agent.state.view_written and not agent.state.trimmed:
                trim_heap()  # once, after start-up's imports and planning
                agent.state.trimmed = True
            if stop.is_set():
                break
            agent.wait(agent.wait_s(), lambda timeout: health.watch_once(
                source, watched, api=api, node=config.node_name, boot_id=boot,
                timeout_s=timeout, log=agent.log, announced=announced, send=send), stop)
    finally:
        source.close()
        if agent.next_kernel is not None:
            agent.next_kernel.close()
        agent.stop()
        remove_view(config, agent.host)  # a stopped agent has no view: not "fresh"
        agent.reporter.close()
        agent.log.info("agent stopped", xids=watched.summary())
    return verdict


def run_once(agent: Agent, *, deadline_s: float) -> Verdict:
    """`agent --once`: rounds until ready or `deadline_s` passes; daemons it started are
    stopped again, ones it found running are left as they are."""
    end = agent.clock() + deadline_s
    agent.start_grace = False
    try:
        while True:
            verdict = agent.round()
            if verdict.ready or verdict.reason in ("NotInstalled", "DaemonFailing",
                                                   "DaemonRefused") or \
                    agent.clock() >= end:
                return verdict
            time.sleep(min(0.5, max(0.05, end - agent.clock())))
    finally:
        agent.stop(only_started=True)
        agent.reporter.close()


def run_agent(ctx: Context, environ: Mapping[str, str], *, once: bool,
              choose: Callable[[], versionwatch.Choice] | None = None) -> Verdict:
    """The `agent` command: plan (refusing bad settings and packages), then run; `--once`
    raises AgentNotReadyError (exit 12) when the node did not become ready. `choose`
    resolves DRIVER_VERSION_MAP (watched while the agent runs, not with `--once`)."""
    agent = Agent(ctx, environ, choose=None if once else choose)
    plan = agent.prepare()
    if once:
        verdict = run_once(agent, deadline_s=ctx.config.fabric_timeout if plan.fabric
                           else ONCE_START_S)
        if not verdict.ready:
            raise AgentNotReadyError(f"node not ready: {verdict.message}",
                                     remedy="see the agent's log and `status`; the node "
                                            "stays not ready until this is fixed")
        return verdict
    with stop_on_signal() as stop, metrics.serving(agent):
        last = run_forever(agent, stop)
    return last or Verdict(False, "AgentStopped", "stopped before its first round")
