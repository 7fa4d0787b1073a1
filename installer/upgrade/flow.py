"""A driver upgrade on a live node: free the GPUs through Kubernetes, then let install go on.

With UPGRADE_POLICY=evict or drain, when the package's driver differs from the loaded one
and the modules are in use: preflight (nothing is touched if the new driver could not load),
find the holders and their pods, cordon (annotated, so we only uncordon what we cordoned),
evict, wait until the device files are free. `install` then unloads, loads, stages,
verifies and signals; `finish` uncordons. The Node's `<prefix>/upgrade-state` label names
each step (NVIDIA's upgrade states) and an Event tells each one. On failure the node keeps
its cordon, the label says `upgrade-failed` and an Event says why; the old driver still
serves unless the holders were already gone and the unload happened. GPU DaemonSets, whose
pods come straight back, are held away until the new driver is verified (`daemonsets`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from installer.compat.nodelabels import UPGRADE_SKIP, UPGRADE_STATE
from installer.context import Context
from installer.errors import (
    InstallerError,
    UpgradeBlockedError,
    UpgradeTimeoutError,
    UpgradeWaitingError,
)
from installer.installdir.daemons import records_dir
from installer.node import kmod, kube
from installer.node.daemons import stop_all as stop_daemons
from installer.node.holders import Holder, find_holders
from installer.packages.manifest import Package
from installer.stages import load
from installer.upgrade import daemonsets, evictions, jobs, lease, rollout, selection

CORDONED_BY = rollout.CORDONED_BY  # annotation: this installer cordoned the node
REQUIRED, CORDON, POD_DELETION = "upgrade-required", "cordon-required", "pod-deletion-required"
VALIDATION, UNCORDON = "validation-required", "uncordon-required"
DONE, FAILED = "upgrade-done", rollout.FAILED
T = TypeVar("T")


@dataclass
class Upgrade:
    """The cluster side of one run: the API, this node, whether we hold its cordon, whether
    the run puts a driver on the node (an idle upgrade or a fresh install: `upgrade-done`)."""

    ctx: Context
    api: kube.ApiServer
    node: str
    cordoned: bool = False
    replaces: bool = False
    holds_slot: bool = False  # cordoned by an earlier run: it never waits for a turn again
    slot: lease.Slot | None = None  # the pool slot (a Lease) this run holds, renewed
    held: daemonsets.Held = field(default_factory=daemonsets.Held)  # GPU DaemonSets kept away

    def log_fields(self) -> dict[str, Any]:
        return {"node": self.node, "cordoned": self.cordoned}

    def state(self, state: str, extra: dict[str, Any] | None = None) -> None:
        """Move the state label (with any other Node change in the same patch)."""
        body = {"metadata": {"labels": {UPGRADE_STATE: state}}, **(extra or {})}
        _api(lambda: kube.patch_node(self.api, self.node, body))

    def event(self, reason: str, message: str, event_type: str = "Normal") -> None:
        """An Event on the Node; failing to post one is only a warning."""
        try:
            kube.post_node_event(self.api, self.node, reason=reason, message=message,
                                 event_type=event_type)
        except kube.KubeError as exc:
            self.ctx.log.warning("upgrade event not posted", reason=reason, detail=str(exc))


def connect(ctx: Context, *, required: bool) -> Upgrade | None:
    """The cluster side, when a policy other than refuse is configured."""
    node = ctx.config.node_name
    if ctx.config.upgrade_policy == "refuse" or not node:
        return None
    api = kube.connect(ctx.config, os.environ)
    if api is None and not required:
        ctx.log.warning("no Kubernetes API: a cordon left by an earlier upgrade stays")
        return None
    if api is None:
        raise UpgradeBlockedError(f"UPGRADE_POLICY={ctx.config.upgrade_policy} needs the "
                                  "Kubernetes API: no API server URL or service-account token",
                                  remedy="run in the cluster with the DaemonSet's service "
                                         "account, or set --kube-api")
    return Upgrade(ctx, api, node)


def free_gpus(ctx: Context, package: Package) -> Upgrade | None:
    """Before `load`: make the GPUs free when another driver holds them, or do nothing."""
    other = load.other_version(ctx.host, package)
    if other is None or not any(load.in_use(*other)):
        idle = connect(ctx, required=False)  # `finish` lifts a cordon an earlier run left
        if idle is not None:
            idle.replaces = other is not None or kmod.loaded_driver(ctx.host) is None
        return idle
    upgrade = connect(ctx, required=True)
    if upgrade is None:
        return None  # refuse: the load stage says who holds the driver (exit 10)
    upgrade.replaces = True  # upgrade.skip was read before anything (installer.upgrade.skip)
    node = _api(lambda: kube.get_node(upgrade.api, upgrade.node))
    if _labels(node).get(UPGRADE_SKIP) == "true":  # the first read failed; this one did not
        raise UpgradeBlockedError(f"the node is labelled {UPGRADE_SKIP}=true but the label "
                                  "could not be read before; nothing was cordoned",
                                  remedy="rerun: the next run reads the label first and "
                                         "keeps the driver")
    upgrade.cordoned = _is_ours(node)
    upgrade.holds_slot = rollout.holds_slot(node)  # an earlier run cordoned it: resume
    base = upgrade.api  # every call while freeing ends by UPGRADE_TIMEOUT, however slow
    upgrade.api = base.bounded(time.monotonic() + last_look(ctx.config.upgrade_timeout),
                               "UPGRADE_TIMEOUT")
    try:
        _free(upgrade, package, other)
    except UpgradeWaitingError as exc:
        upgrade.api = base
        waiting(upgrade, exc)
        raise
    except InstallerError as exc:
        upgrade.api = base  # the failure is told with a deadline of its own
        failed(upgrade, exc)
        raise
    finally:
        upgrade.api = base
    return upgrade


def _free(upgrade: Upgrade, package: Package, other: load.OtherVersion) -> None:
    ctx, config = upgrade.ctx, upgrade.ctx.config
    deadline = time.monotonic() + config.upgrade_timeout
    interval = poll_interval(config.upgrade_timeout)
    wanted = package.manifest.driver_version
    with _step(ctx, REQUIRED):
        upgrade.state(REQUIRED)
        upgrade.event("DriverUpgradeRequired", f"driver {_loaded(other)} is in use; "
                      f"upgrading to {wanted} (policy {config.upgrade_policy})")
        load.preflight(ctx, package)
        stop_daemons(ctx.host, timeout_s=config.daemon_stop_timeout,  # they hold the GPUs
                     records=records_dir(config, ctx.host.roots))
        _plan(upgrade, other, cordoned=upgrade.holds_slot)  # refused before any change
        if upgrade.holds_slot:
            upgrade.event("DriverUpgradeResumed", "the node is still cordoned by an earlier "
                          "run of this upgrade: it keeps its slot and resumes")
        else:
            upgrade.slot = rollout.take_turn(
                upgrade.api, upgrade.node, config.upgrade_max_unavailable,
                namespace=kube.own_namespace(upgrade.api), deadline=deadline,
                interval=interval)
    with _step(ctx, CORDON):
        upgrade.state(CORDON)
        cordon(upgrade)
    if config.upgrade_wait_for_jobs:  # its own limit: the eviction's deadline starts after
        deadline += _wait_for_jobs(upgrade)
    plan = _plan(upgrade, other, cordoned=upgrade.cordoned)  # a pod may have started since
    with _step(ctx, POD_DELETION, pods=len(plan.going)):
        upgrade.state(POD_DELETION)
        grace = config.upgrade_grace_period
        _api(lambda: daemonsets.pause(upgrade, deadline=deadline, interval=interval))
        _api(lambda: evictions.evict_all(upgrade.api, plan.evict, grace_s=grace,
                                         deadline=deadline, interval=interval,
                                         on_event=upgrade.event))
        _api(lambda: daemonsets.hold_gate(upgrade, plan.delete))  # before the deletes
        _api(lambda: evictions.delete_all(upgrade.api, plan.delete, grace_s=grace,
                                          on_event=upgrade.event))
        _api(lambda: evictions.wait_gone(upgrade.api, plan.going, deadline=deadline))
        wait_free(ctx, package, deadline=deadline, interval=interval,
                  describe=lambda found: daemonsets.describe(upgrade, found))
    upgrade.event("DriverUpgradeGpusFreed", "no process holds /dev/nvidia* any more; "
                  f"unloading {_loaded(other)} and installing {wanted}")
    upgrade.state(VALIDATION)


def _wait_for_jobs(upgrade: Upgrade) -> float:
    """The selected Jobs' pods finish (or their timeout passes) before the eviction. The
    wait has its own limit: UPGRADE_TIMEOUT, for every call after it, counts from its end."""
    ctx, config = upgrade.ctx, upgrade.ctx.config
    bound, start = upgrade.api, time.monotonic()
    upgrade.api = replace(bound, until=None)  # its calls and Events have their own deadlines
    try:
        with _step(ctx, jobs.WAIT_FOR_JOBS):
            upgrade.state(jobs.WAIT_FOR_JOBS)
            jobs.wait(config, upgrade.api, upgrade.node,
                      interval=poll_interval(config.upgrade_timeout), event=upgrade.event,
                      log=ctx.log)
    finally:
        waited = time.monotonic() - start
        upgrade.api = bound if bound.until is None else bound.bounded(
            bound.until + waited, bound.until_name)
    return waited


def _plan(upgrade: Upgrade, other: load.OtherVersion, *, cordoned: bool) -> selection.Plan:
    """The pods to evict, or UpgradeBlockedError (saying if our cordon stands)."""
    ctx, config = upgrade.ctx, upgrade.ctx.config
    foreign, _ = load.in_use(*other)
    if foreign:
        raise UpgradeBlockedError(f"modules of another driver are held by "
                                  f"{', '.join(foreign)}; evicting pods cannot free them")
    holders = find_holders(ctx.host)
    raw = _api(lambda: kube.pods_on_node(upgrade.api, upgrade.node))
    pods = [selection.pod_from_api(p) for p in raw]
    paused = _api(lambda: daemonsets.pausing(upgrade, raw))  # the pause frees those
    kept = [h for h in holders if not (h.pod and h.pod.pod_uid in paused)]
    rules = selection.Rules(config.upgrade_policy, config.upgrade_restart_daemonsets,
                            config.upgrade_force, config.upgrade_delete_emptydir_data)
    plan = selection.plan(kept, pods, node=upgrade.node, rules=rules, daemonset_exists=(
        lambda pod: _api(lambda: kube.daemonset_exists(upgrade.api, pod.namespace,
                                                        pod.owner_name))),
        paused=[p for p in pods if p.uid in paused], undone=selection.undone(cordoned))
    if not holders:
        raise UpgradeBlockedError(
            "the loaded driver is in use, but no process in this PID namespace has "
            f"/dev/nvidia* open; {selection.undone(cordoned)}",
            remedy="run the installer with hostPID: true (the DaemonSet does), or find the "
                   "user with `lsof /dev/nvidia*` on the node")
    return plan


def cordon(upgrade: Upgrade) -> None:
    """Mark the node unschedulable, annotated as ours; a cordon we did not set stays theirs."""
    node = _api(lambda: kube.get_node(upgrade.api, upgrade.node))
    unschedulable = _spec(node).get("unschedulable") is True
    if unschedulable and not _is_ours(node):
        upgrade.cordoned = False
        upgrade.event("DriverUpgradeCordon", "node was already cordoned by someone else: "
                      "it will not be uncordoned by the installer")
        return
    if not unschedulable:  # also when our annotation outlived a manual uncordon
        upgrade.state(CORDON, {"spec": {"unschedulable": True},
                               "metadata": {"labels": {UPGRADE_STATE: CORDON},
                                            "annotations": {CORDONED_BY: _me()}}})
    upgrade.cordoned = True
    upgrade.event("DriverUpgradeCordoned", "node cordoned for the driver upgrade")


def wait_free(ctx: Context, package: Package, *, deadline: float, interval: float,
              describe: Callable[[Sequence[Holder]], str] | None = None) -> None:
    """Until no process holds the device files and the modules' users are gone."""
    while True:
        other = load.other_version(ctx.host, package)
        holders = find_holders(ctx.host)
        if not holders and (other is None or not any(load.in_use(*other))):
            return
        if time.monotonic() >= deadline:
            named = ((describe(holders) if describe else ", ".join(
                h.describe() for h in holders)) or "module users outside /proc")
            raise UpgradeTimeoutError(f"the GPUs were still held by {named} when "
                                      "UPGRADE_TIMEOUT ran out; nothing was unloaded")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def finish(ctx: Context, upgrade: Upgrade | None) -> None:
    """After a verified install: uncordon if we cordoned, and say the upgrade is done; then
    give the pool slot back (a cordon left standing still counts against the limit).

    A cordon this run set must be lifted (failing to is an error: the pod retries); one an
    earlier run left is lifted when the API answers, else a warning says it stays."""
    if upgrade is None:
        return
    try:
        _finish(ctx, upgrade)
    finally:
        lease.release(upgrade.slot)


def _finish(ctx: Context, upgrade: Upgrade) -> None:
    try:
        node = _api(lambda: kube.get_node(upgrade.api, upgrade.node))
    except UpgradeBlockedError as exc:
        if upgrade.cordoned:
            raise
        ctx.log.warning("could not read the node: a cordon an earlier upgrade left stays",
                        detail=exc.message)
        return
    daemonsets.release_gate(upgrade, verified=True)
    _api(lambda: daemonsets.resume(upgrade, node))  # gpu-operator's DaemonSets come back
    ours = upgrade.cordoned or _is_ours(node)
    if not ours and not upgrade.replaces and _labels(node).get(UPGRADE_STATE) in (None, DONE):
        return  # the same driver restarted: nothing of ours to undo
    done = {"metadata": {"labels": {UPGRADE_STATE: DONE}, "annotations": {CORDONED_BY: None}}}
    if not ours:  # idle, fresh or resumed without our cordon: the label is all there is
        try:
            upgrade.state(DONE, done)
        except UpgradeBlockedError as exc:
            ctx.log.warning("upgrade-done label not set", detail=exc.message)
            return
        upgrade.event("DriverUpgradeDone", "driver validated")
        return
    with _step(ctx, UNCORDON, uncordon=ours):
        upgrade.state(UNCORDON)
        upgrade.state(DONE, {"spec": {"unschedulable": None}, **done})
    upgrade.event("DriverUpgradeDone", "driver validated; node uncordoned")


def failed(upgrade: Upgrade | None, exc: InstallerError) -> None:
    """Leave the node as it is (cordoned if we cordoned it), labelled and told why."""
    if upgrade is None:
        return
    _give_back(upgrade)
    try:
        upgrade.state(FAILED)
    except InstallerError as label_error:
        upgrade.ctx.log.warning("upgrade-failed label not set", detail=label_error.message)
    said = selection.STILL_CORDONED in exc.message  # a refusal on our cordon says it already
    kept = "; the node stays cordoned" if upgrade.cordoned and not said else ""
    upgrade.event("DriverUpgradeFailed", exc.one_line() + kept, "Warning")
    lease.release(upgrade.slot)  # its cordon, if any, keeps counting against the limit


def waiting(upgrade: Upgrade, exc: UpgradeWaitingError) -> None:
    """The turn did not come: no failure of this node, which was not touched. It stays
    `upgrade-required` (others never count it against the limit), told why."""
    _give_back(upgrade)
    try:
        upgrade.state(REQUIRED)
    except InstallerError as label_error:
        upgrade.ctx.log.warning("upgrade-required label not set", detail=label_error.message)
    upgrade.event("DriverUpgradeWaiting", exc.message)


def _give_back(upgrade: Upgrade) -> None:
    """After a failure: the device-plugin gate reopens while the old driver still serves,
    and gpu-operator's DaemonSets return (as NVIDIA's driver manager does on failure: they
    wait at their own driver-ready gate when no driver is ready)."""
    try:
        daemonsets.release_gate(upgrade, verified=False)
        daemonsets.resume(upgrade, kube.get_node(upgrade.api, upgrade.node))
    except (InstallerError, OSError, kube.KubeError) as exc:
        upgrade.ctx.log.warning("GPU DaemonSets not given back", detail=str(exc))


def last_look(timeout: float) -> float:
    """When API calls made while freeing the GPUs must have ended: UPGRADE_TIMEOUT and the
    little more the waits' last look after it takes (then they name what is still pending)."""
    return timeout + min(2.0, timeout / 2)


def poll_interval(timeout: float) -> float:
    """Retry and poll period: kubectl drain's 5 s, shorter for short timeouts."""
    return min(5.0, max(0.1, timeout / 20))


@contextmanager
def _step(ctx: Context, step: str, **fields: Any) -> Iterator[None]:
    """One log event per step, with its duration."""
    start = time.perf_counter()
    yield
    ctx.log.info("upgrade step", step=step, **fields,
                 duration_ms=round((time.perf_counter() - start) * 1000, 1))


def _api(call: Callable[[], T]) -> T:
    """A Kubernetes call whose failure blocks the upgrade (exit 15) rather than crashing;
    one that UPGRADE_TIMEOUT cut short is a timeout (exit 16)."""
    try:
        return call()
    except kube.Late as exc:
        if not exc.bound:
            raise UpgradeBlockedError(f"Kubernetes API: {exc}",
                                      remedy="check that the API server answers") from exc
        raise UpgradeTimeoutError(f"Kubernetes API: {exc}; nothing was unloaded",
                                  remedy="check that the API server answers, or raise "
                                         "UPGRADE_TIMEOUT; the next run resumes") from exc
    except kube.Malformed as exc:
        raise UpgradeBlockedError(f"Kubernetes API: {exc}",
                                  remedy="check what answers at the API server's address "
                                         "(a proxy or load balancer in its place?)") from exc
    except kube.KubeError as exc:
        raise UpgradeBlockedError(f"Kubernetes API: {exc}",
                                  remedy="check the installer's RBAC (docs/upgrading.md, the "
                                         "live-upgrade overlay) and the API server") from exc


def _labels(node: dict[str, Any]) -> dict[str, Any]:
    labels = (node.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _spec(node: dict[str, Any]) -> dict[str, Any]:
    spec = node.get("spec")
    return spec if isinstance(spec, dict) else {}


def _is_ours(node: dict[str, Any]) -> bool:
    annotations = (node.get("metadata") or {}).get("annotations")
    return isinstance(annotations, dict) and CORDONED_BY in annotations


def _me() -> str:
    """Who cordoned: this pod (the downward API's HOSTNAME) or the installer."""
    return os.environ.get("HOSTNAME") or "gpu-node-installer"


def _loaded(other: load.OtherVersion) -> str:
    states = other[0]
    return next((s.version or "?" for n, s in states.items() if n == "nvidia"), "?")
