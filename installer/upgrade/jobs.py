"""Wait for Jobs: after the cordon, before the eviction step, the pods UPGRADE_WAIT_FOR_JOBS
selects on this node are waited for, not evicted, while they are Running or Pending.

As NVIDIA's upgrade library (k8s-operator-libs pkg/upgrade/base/pod_manager.go,
ScheduleCheckOnPodCompletion and HandleTimeoutOnPodCompletions, commit 110a5208): the node
is labelled `wait-for-jobs-required`; the selected pods on the node are listed again every
poll; once none is Running or Pending (finished, failed or gone) the eviction step goes
on; when UPGRADE_WAIT_FOR_JOBS_TIMEOUT (0: none) passes first, it goes on all the same and
the pods still running are treated as any other pod (evicted when they hold a GPU). An
Event names the pods waited for, and one says how the wait ended. A list the API does not
answer is tried again at the next poll: it never ends the wait early.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from installer.config import Config
from installer.config.upgrade import Term, integer64
from installer.node import kube

WAIT_FOR_JOBS = "wait-for-jobs-required"  # NVIDIA's upgrade state of the same step
_RUNNING = ("Running", "Pending")
CALL_S = 30.0  # one list of the node's pods, retries included
Event = Callable[[str, str], None]


def matches(terms: tuple[Term, ...], labels: dict[str, Any]) -> bool:
    """Every term holds for the labels, as the API server matches a labelSelector
    (apimachinery pkg/labels/selector.go, Requirement.Matches @ eed236ce): `!=` and `notin`
    hold for a pod without the key, `<` and `>` only for an integer value."""
    return all(_holds(term, labels) for term in terms)


def _holds(term: Term, labels: dict[str, Any]) -> bool:
    key, op, values = term
    if op in ("exists", "!exists"):
        return (key in labels) == (op == "exists")
    if key not in labels:
        return op in ("!=", "notin")
    value = str(labels[key])
    if op in ("=", "in"):
        return value in values
    if op in ("!=", "notin"):
        return value not in values
    if not integer64(value):
        return False
    return int(value) > int(values[0]) if op == ">" else int(value) < int(values[0])


def running(pods: list[dict[str, Any]], terms: tuple[Term, ...]) -> list[str]:
    """`namespace/name` of the selected pods still Running or Pending."""
    found = []
    for pod in pods:
        metadata, status = _mapping(pod.get("metadata")), _mapping(pod.get("status"))
        if matches(terms, _mapping(metadata.get("labels"))) and status.get("phase") in _RUNNING:
            found.append(f"{metadata.get('namespace')}/{metadata.get('name')}")
    return sorted(found)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def wait(config: Config, api: kube.ApiServer, node: str, *, interval: float, event: Event,
         log: Any, clock: Callable[[], float] = time.monotonic) -> float:
    """Until the selected pods on `node` are done or the timeout passed; the seconds
    waited (the caller's eviction deadline starts after them)."""
    terms = config.upgrade_wait_for_jobs
    limit = config.upgrade_wait_for_jobs_timeout
    start = clock()
    shown = selector_text(terms)
    told: list[str] | None = None
    while True:
        try:
            pods = kube.pods_on_node(api.bounded(clock() + CALL_S, "its pod list"), node)
        except kube.KubeError as exc:
            log.warning("pods not listed while waiting for jobs", detail=str(exc))
        else:
            left = running(pods, terms)
            if not left:
                if told:
                    event("DriverUpgradeJobsDone", f"the pods selected by {shown} finished; "
                          "evicting the GPU pods")
                return clock() - start
            if told is None:
                event("DriverUpgradeWaitingForJobs", f"waiting for {len(left)} pod(s) "
                      f"selected by {shown} to finish before the eviction: "
                      f"{', '.join(left[:10])}" + (f" (limit {limit:g} s)" if limit else ""))
            told = left
        if limit and clock() - start >= limit:
            event("DriverUpgradeJobsTimeout", f"UPGRADE_WAIT_FOR_JOBS_TIMEOUT ({limit:g} s) "
                  f"passed with {', '.join((told or ['pods'])[:10])} still running; the "
                  "eviction step goes on")
            return clock() - start
        pause = interval if not limit else min(interval, max(0.0, start + limit - clock()))
        time.sleep(pause)


def selector_text(terms: tuple[Term, ...]) -> str:
    """The selector as the API writes it."""
    parts = []
    for key, op, values in terms:
        if op in ("in", "notin"):
            parts.append(f"{key} {op} ({','.join(values)})")
        else:
            parts.append(key if op == "exists" else f"!{key}" if op == "!exists"
                         else f"{key}{op}{values[0]}")
    return ",".join(parts)
