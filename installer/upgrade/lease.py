"""A coordination.k8s.io/v1 Lease per pool slot: the atomic part of UPGRADE_MAX_UNAVAILABLE.

The pool has as many slots as the limit allows (`rollout.limit`), each a Lease named
`gpu-node-installer-upgrade-slot-<i>` in the installer's namespace. A node takes a slot
before it cordons: it creates the Lease (the API answers 409 to all but one creator) or,
when the holder released it or let it expire (renewTime + leaseDurationSeconds passed),
updates it carrying the resourceVersion it read (409 to all but one writer): two nodes can
never hold one slot. The holder renews it every RENEW_S while it upgrades, and gives it back
at the end (holderIdentity cleared, as client-go's leader election releases). A holder that
dies stops renewing; its slot is taken over only after it expired. Expiry is read from
renewTime against this node's clock: node clocks are assumed NTP-synchronised, a skew
shortens or lengthens the wait by as much.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from installer.compat.nodelabels import OWN_PREFIX
from installer.node import kube

PREFIX = "gpu-node-installer-upgrade-slot-"
DURATION_S = 60  # leaseDurationSeconds: how long a holder that stopped renewing keeps it
RENEW_S = 15.0
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # metav1.MicroTime


@dataclass
class Slot:
    """A slot this node holds: the Lease as last written, renewed on its own thread."""

    api: kube.ApiServer
    namespace: str
    index: int
    lease: dict[str, Any]
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one write at a time
    lost: bool = False  # a renewal found the Lease taken over (it had expired)

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.index}"


def holder(lease: dict[str, Any] | None, now: datetime) -> str | None:
    """Who holds the Lease now: its holderIdentity while unexpired, else None."""
    spec = (lease or {}).get("spec") or {}
    who, renewed = spec.get("holderIdentity"), _parse(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if not who or renewed is None or not isinstance(duration, int):
        return None
    return str(who) if renewed + timedelta(seconds=duration) > now else None


def read(api: kube.ApiServer, namespace: str, count: int) -> dict[int, dict[str, Any] | None]:
    """The pool's slot Leases (None: not created yet)."""
    return {i: _get(api, namespace, f"{PREFIX}{i}") for i in range(count)}


def take(api: kube.ApiServer, namespace: str, index: int, lease: dict[str, Any] | None,
         me: str) -> Slot | None:
    """Take slot `index` as read (`lease`): create it, or update the version read when it is
    free or already ours; None when another writer got there first (409)."""
    at = now()
    spec = {"holderIdentity": me, "leaseDurationSeconds": DURATION_S,
            "renewTime": at.strftime(_MICRO)}
    path = _path(namespace)
    if lease is None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": f"{PREFIX}{index}", "namespace": namespace,
                             "labels": {f"{OWN_PREFIX}/upgrade-slot": str(index)}},
                "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0}}
        written = _write(api, "POST", path, body)
    else:
        old = lease.get("spec") or {}
        if holder(lease, at) not in (None, me):
            return None
        moved = old.get("holderIdentity") != me
        body = {**lease, "spec": {**old, **spec, **({"acquireTime": spec["renewTime"],
                "leaseTransitions": int(old.get("leaseTransitions") or 0) + 1} if moved
                else {})}}
        written = _write(api, "PUT", f"{path}/{PREFIX}{index}", body)
    if written is None:
        return None
    slot = Slot(replace(api, until=None, until_name=""), namespace, index, written)
    threading.Thread(target=_keep, args=(slot,), daemon=True).start()
    return slot


def release(slot: Slot | None) -> None:
    """Stop renewing and give the slot back (holder cleared); failing to is only late: the
    Lease then expires by itself."""
    if slot is None:
        return
    with slot.lock:
        slot.stop.set()
        if slot.lost:
            return
        spec = {k: v for k, v in (slot.lease.get("spec") or {}).items()
                if k != "holderIdentity"}
        with contextlib.suppress(kube.KubeError):  # unanswered: it expires by itself
            _write(slot.api, "PUT", f"{_path(slot.namespace)}/{slot.name}",
                   {**slot.lease, "spec": {**spec, "leaseDurationSeconds": 1}})


def _keep(slot: Slot) -> None:
    """Renew every RENEW_S until released; a 409 means it was taken over: stop."""
    while not slot.stop.wait(RENEW_S):
        with slot.lock:
            if slot.stop.is_set():
                return
            spec = {**(slot.lease.get("spec") or {}), "renewTime": now().strftime(_MICRO)}
            try:
                written = _write(slot.api, "PUT", f"{_path(slot.namespace)}/{slot.name}",
                                 {**slot.lease, "spec": spec})
            except kube.KubeError:
                continue  # the API did not answer: try again; the Lease lasts DURATION_S
            if written is None:
                slot.lost = True
                return
            slot.lease = written


def _get(api: kube.ApiServer, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return api.call("GET", f"{_path(namespace)}/{name}", None, "application/json")
    except kube.KubeError as exc:
        if exc.status == 404:
            return None
        raise


def _write(api: kube.ApiServer, method: str, path: str, body: dict[str, Any]
           ) -> dict[str, Any] | None:
    """POST or PUT; None on 409 (it exists already, or changed since it was read)."""
    try:
        return api.call(method, path, body, "application/json")
    except kube.KubeError as exc:
        if exc.status == 409:
            return None
        raise


def _path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def now() -> datetime:
    """The wall clock expiry is read against (see the module docstring)."""
    return datetime.now(UTC)


def _parse(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    for form in (_MICRO, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, form).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None
