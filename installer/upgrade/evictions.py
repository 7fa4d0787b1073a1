"""Making the chosen pods go (`selection` chooses them), and waiting until they are gone.

Evictions go through the Eviction API (policy/v1), so PodDisruptionBudgets are honoured,
each with the pod's UID as a precondition: a pod recreated under the same name (a
StatefulSet's) answers 409 and is never evicted, the one we planned for being gone. A 429 is
retried until UPGRADE_TIMEOUT, as kubectl drain retries it. So is a 403 whose cause is
NamespaceTerminating (the API creates nothing in a namespace being deleted, evictions
included): the namespace controller is deleting the pod anyway, so once the pod shows a
deletionTimestamp it is only waited for. DaemonSet pods are deleted (their controller would
ignore an eviction's intent), with a UID precondition. An accepted eviction only starts the
pod's termination: the API keeps it, Terminating, until its processes exit or its grace period
ends, so the unload waits until every such pod is gone (404, or a new pod under its name).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from installer.errors import UpgradeTimeoutError
from installer.node import kube
from installer.upgrade.selection import Pod

_WHY_PENDING = {"refused": "HTTP 429: a PodDisruptionBudget does not allow it",
                "namespace-terminating": "HTTP 403: its namespace is being deleted and the "
                                         "pod is not terminating yet"}
_RETRY_EVENT = {"refused": "refused (PodDisruptionBudget); retrying",
                "namespace-terminating": "refused: its namespace is terminating; retrying "
                                         "until the namespace controller deletes the pod"}
WAIT_POLL_S = 1.0  # how often a terminating pod is looked at (kubectl drain: 1 s)


def evict_all(api: kube.ApiServer, pods: Sequence[Pod], *, grace_s: int | None,
              deadline: float, interval: float, on_event: Callable[[str, str], None]) -> None:
    """Evict each pod; a 429 (a PodDisruptionBudget) or a 403 in a terminating namespace is
    retried until `deadline`."""
    pending: dict[str, tuple[Pod, str]] = {p.ref: (p, "") for p in pods}
    told: set[str] = set()
    while True:
        for ref, (pod, _) in list(pending.items()):
            outcome = kube.evict(api, pod.namespace, pod.name, pod.uid, grace_s)
            if outcome == "namespace-terminating" and _terminating_or_gone(api, pod):
                outcome = "terminating"  # the namespace controller deletes it: wait for it
            if outcome in _RETRY_EVENT:
                pending[ref] = (pod, outcome)
                if ref not in told:
                    told.add(ref)
                    on_event("DriverUpgradeEvictionRefused",
                             f"eviction of {ref} {_RETRY_EVENT[outcome]}")
                continue
            del pending[ref]
            on_event("DriverUpgradeEvicted", f"evicted pod {ref} ({outcome})")
        if not pending:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(f"{ref} ({_WHY_PENDING[why]})" for ref, (_, why)
                              in pending.items())
            raise UpgradeTimeoutError(
                f"evicting {names} was still refused when UPGRADE_TIMEOUT ran out; the old "
                "driver still serves",
                remedy="relax that PodDisruptionBudget (or finish deleting that namespace) "
                       "or raise UPGRADE_TIMEOUT; the node stays cordoned and the next run "
                       "resumes")
        _sleep(interval, deadline)


def _terminating_or_gone(api: kube.ApiServer, pod: Pod) -> bool:
    """Whether the pod we planned for is already being deleted, or gone."""
    now = kube.get_pod(api, pod.namespace, pod.name)
    meta = (now or {}).get("metadata") or {}
    return now is None or meta.get("uid") != pod.uid or bool(meta.get("deletionTimestamp"))


def delete_all(api: kube.ApiServer, pods: Sequence[Pod], *, grace_s: int | None,
               on_event: Callable[[str, str], None]) -> None:
    """Delete DaemonSet pods (their controller recreates them; eviction would not help)."""
    for pod in pods:
        outcome = kube.delete_pod(api, pod.namespace, pod.name, pod.uid, grace_s)
        on_event("DriverUpgradeDeleted", f"deleted DaemonSet pod {pod.ref} ({outcome})")


def wait_gone(api: kube.ApiServer, pods: Sequence[Pod], *, deadline: float) -> None:
    """Until each pod is gone from the API (404, or another pod under its name): a pod
    stays Terminating while its processes shut down, up to its whole grace period when
    they ignore SIGTERM."""
    pending = {p.ref: p for p in pods}
    while True:
        for ref, pod in list(pending.items()):
            now = kube.get_pod(api, pod.namespace, pod.name)
            if now is None or ((now.get("metadata") or {}).get("uid")) != pod.uid:
                del pending[ref]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise UpgradeTimeoutError(
                f"pod(s) {', '.join(pending)} were still terminating when UPGRADE_TIMEOUT "
                "ran out (their grace period is longer, or kubelet cannot stop them); "
                "nothing was unloaded",
                remedy="raise UPGRADE_TIMEOUT above the pods' grace period or lower "
                       "UPGRADE_GRACE_PERIOD; the node stays cordoned and the next run "
                       "resumes")
        _sleep(WAIT_POLL_S, deadline)


def _sleep(interval: float, deadline: float) -> None:
    time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
