"""coordination.k8s.io/v1 Leases on the fake API server (tests/kubefake.py routes them here).

As the real API server stores them: GET (404 when absent), POST creates (409 AlreadyExists
when the name is taken), PUT updates only with the stored `metadata.resourceVersion`
(422 without one: Leases allow no unconditional update; 409 Conflict with a stale one), and
creates one that is absent (create on update); every write gets a new resourceVersion and
is validated against the Lease schema. Sources, kubernetes/kubernetes:
pkg/registry/coordination/lease/strategy.go @152eb4fe742612b9f7b9a9c294ea5836191aa30b
(AllowUnconditionalUpdate false, AllowCreateOnUpdate true) and
staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
@f565665e0604a5aebe7116339096b961becf7e23 (Store.Update: "must be specified for an update",
and the optimistic-lock Conflict).

The API server gives a Lease no meaning; its holders agree on one: held by
`spec.holderIdentity` until renewTime + leaseDurationSeconds. The fake checks that protocol:
a write that hands a Lease to another holder while it is still held (not expired, not
released) is recorded in `Cluster.errors`, so a test fails when two nodes ever think they
hold one slot. `expire(cluster, name)` ages a Lease past its duration (a holder that died).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kubedocs import Doc, validate

if TYPE_CHECKING:
    from kubefake import Cluster

_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"
PATH = ["apis", "coordination.k8s.io", "v1", "namespaces"]


def route(cluster: Cluster, method: str, parts: list[str], body: Doc | None
          ) -> tuple[int, Doc, Doc | None] | None:
    """The answer for a Lease path, or None when `parts` is not one."""
    if parts[:4] != PATH or len(parts) not in (6, 7) or parts[5] != "leases":
        return None
    namespace = parts[4]
    name = parts[6] if len(parts) == 7 else None
    if method == "GET" and name:
        found = cluster.leases.get(f"{namespace}/{name}")
        return (200, found, None) if found else (404, _not_found(name), None)
    if method == "POST" and name is None and body is not None:
        return _create(cluster, namespace, body)
    if method == "PUT" and name and body is not None:
        return _update(cluster, namespace, name, body)
    return None


def _create(cluster: Cluster, namespace: str, body: Doc) -> tuple[int, Doc, Doc | None]:
    name = str(body.get("metadata", {}).get("name", ""))
    key = f"{namespace}/{name}"
    if key in cluster.leases:
        return 409, {**_failure(409, f'leases.coordination.k8s.io "{name}" already exists'),
                     "reason": "AlreadyExists"}, body
    stored = _stored(cluster, namespace, body)
    stored["metadata"]["uid"] = str(uuid.uuid4())
    stored["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())
    _check_handover(cluster, key, None, stored)
    cluster.leases[key] = stored
    return 201, stored, body


def _update(cluster: Cluster, namespace: str, name: str, body: Doc
            ) -> tuple[int, Doc, Doc | None]:
    key = f"{namespace}/{name}"
    old = cluster.leases.get(key)
    if old is None:
        return _create(cluster, namespace, {**body, "metadata": {
            k: v for k, v in body.get("metadata", {}).items() if k != "resourceVersion"}})
    version = body.get("metadata", {}).get("resourceVersion")
    if not version:
        return 422, _failure(422, f'Lease.coordination.k8s.io "{name}" is invalid: '
                                  "metadata.resourceVersion: Invalid value: 0x0: must be "
                                  "specified for an update"), body
    if version != old["metadata"]["resourceVersion"]:
        return 409, {**_failure(409, f'Operation cannot be fulfilled on '
                                     f'leases.coordination.k8s.io "{name}": the object has '
                                     "been modified; please apply your changes to the "
                                     "latest version and try again"),
                     "reason": "Conflict"}, body
    stored = _stored(cluster, namespace, body)
    stored["metadata"]["uid"] = old["metadata"]["uid"]
    _check_handover(cluster, key, old, stored)
    cluster.leases[key] = stored
    return 200, stored, body


def _stored(cluster: Cluster, namespace: str, body: Doc) -> Doc:
    """The body as stored: its namespace, a new resourceVersion, schema-checked."""
    cluster.lease_version += 1
    stored: dict[str, Any] = {**body, "metadata": {**body.get("metadata", {}),
                                                   "namespace": namespace,
                                                   "resourceVersion":
                                                       str(cluster.lease_version)}}
    validate(stored)
    return stored


def holder(lease: Doc | None, now: datetime | None = None) -> str | None:
    """Who holds it by the protocol: holderIdentity until renewTime + duration."""
    spec = (lease or {}).get("spec", {})
    who, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    if not who or not renewed:
        return None
    until = datetime.strptime(renewed, _MICRO).replace(tzinfo=UTC) + timedelta(
        seconds=spec.get("leaseDurationSeconds", 0))
    return str(who) if until > (now or datetime.now(UTC)) else None


def _check_handover(cluster: Cluster, key: str, old: Doc | None, new: Doc) -> None:
    """A Lease may change holder only once its holder released it or it expired."""
    before = holder(old)
    after = new.get("spec", {}).get("holderIdentity")
    if before and after and after != before:
        cluster.errors.append(f"lease {key} taken by {after} while {before} held it")


def expire(cluster: Cluster, name: str, namespace: str = "default") -> None:
    """Age the Lease past its duration, as if its holder had died long ago."""
    lease = cluster.leases[f"{namespace}/{name}"]
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"


def _not_found(name: str) -> Doc:
    return {**_failure(404, f'leases.coordination.k8s.io "{name}" not found'),
            "reason": "NotFound"}


def _failure(code: int, message: str) -> Doc:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "message": message}
