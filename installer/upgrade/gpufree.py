"""Freeing GPUs for a MIG repartition with the live upgrade's eviction flow.

The partition stage finds the processes holding a GPU whose layout must change; under
UPGRADE_POLICY=evict|drain the pipeline hands it `free`, which evicts (or, for DaemonSet
pods with UPGRADE_RESTART_DAEMONSETS, deletes) their pods and the GPU pods through the
Eviction API, as a driver upgrade does, then waits until no process holds those devices.
No cordon: the node keeps its driver, and the pods' controllers bring them back once the
slices are advertised.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from installer.context import Context
from installer.errors import UpgradeTimeoutError
from installer.node import kube
from installer.node.holders import Holder, find_holders
from installer.upgrade import evictions, flow, selection


def free(ctx: Context, holders: Sequence[Holder], devices: Sequence[str]) -> None:
    """Evict the holders' pods (and the node's GPU pods), then wait for the devices."""
    upgrade = flow.connect(ctx, required=True)
    if upgrade is None:
        return  # refuse: the stage names the holders (exit 10)
    config = ctx.config
    deadline = time.monotonic() + config.upgrade_timeout
    interval = flow.poll_interval(config.upgrade_timeout)
    api = upgrade.api.bounded(time.monotonic() + flow.last_look(config.upgrade_timeout),
                              "UPGRADE_TIMEOUT")  # no call outlives the deadline
    pods = [selection.pod_from_api(p) for p in
            flow._api(lambda: kube.pods_on_node(api, upgrade.node))]
    rules = selection.Rules(config.upgrade_policy, config.upgrade_restart_daemonsets,
                            config.upgrade_force, config.upgrade_delete_emptydir_data)
    plan = selection.plan(holders, pods, node=upgrade.node, rules=rules, daemonset_exists=(
        lambda pod: flow._api(lambda: kube.daemonset_exists(api, pod.namespace,
                                                             pod.owner_name))))
    upgrade.event("MigRepartitionEvicting", f"freeing GPUs {', '.join(devices)} for a MIG "
                  f"repartition: {len(plan.going)} pod(s)")
    grace = config.upgrade_grace_period
    flow._api(lambda: evictions.evict_all(api, plan.evict, grace_s=grace, deadline=deadline,
                                          interval=interval, on_event=upgrade.event))
    flow._api(lambda: evictions.delete_all(api, plan.delete, grace_s=grace,
                                           on_event=upgrade.event))
    flow._api(lambda: evictions.wait_gone(api, plan.going, deadline=deadline))
    _wait_devices(ctx, devices, deadline=deadline, interval=interval)


def _wait_devices(ctx: Context, devices: Sequence[str], *, deadline: float,
                  interval: float) -> None:
    while True:
        left = [h for h in find_holders(ctx.host, devices) if h.pid != os.getpid()]
        if not left:
            return
        if time.monotonic() >= deadline:
            raise UpgradeTimeoutError(
                f"{', '.join(devices)} were still held by "
                f"{', '.join(h.describe() for h in left)} when UPGRADE_TIMEOUT ran out; "
                "no MIG layout was changed")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
