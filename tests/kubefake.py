"""A strict fake Kubernetes API server on 127.0.0.1 for the upgrade flow's tests.

No real API server can run on the test machines, so this one is strict where it matters:
every body is validated against the Kubernetes schemas bundled with kubernetes-validate
(Node after applying a merge patch, Eviction, DeleteOptions, Event; the Pods and DaemonSets
it serves too), the bearer token and content types are checked, Evictions answer 201, 429
(a PodDisruptionBudget), 403 (NamespaceTerminating) or 404 as scripted (then 409 when the
Eviction's UID precondition names another pod, as a delete's does), and every call is
recorded in order with the Node's `upgrade-state` label and cordon at that moment. Leases
(the pool's upgrade slots) are served as the API stores them (tests/kubelease.py). Every
Node write bumps its resourceVersion, and a patch carrying a stale one is a 409. Anything
it does not know is a 404 and a recorded error, so a test that forgets to expect a call fails.

Pods terminate as on a real cluster: an accepted eviction or delete sets
`deletionTimestamp` and `deletionGracePeriodSeconds` (the request's, else the pod's own,
else 30), and the pod leaves the API only when its processes exit (see `Cluster`).

`faults` may also script a raw answer (`Reply`): any status and body bytes, optionally
trickled one byte every `trickle_s` (an answer that never trips a per-read timeout), with
headers such as Retry-After. `serve(cluster, tls=(cert, key))` serves https; `Proxy` is a
forward proxy on 127.0.0.1 that records each connection (CONNECT or absolute-form) and
relays it, to show which calls went through a proxy.

Runs in the test process (host tier) or in the guest (kernel tier: `python -m kubefake`
is not needed; the guest script imports `serve`). The documents it serves, and the schema
check, are in tests/kubedocs.py.
"""

from __future__ import annotations

import json
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubelease
import kubernetes_validate
from kubedocs import VERSION as VERSION
from kubedocs import Doc, merge_patch, namespace_terminating, validate, validate_delete_options
from kubedocs import daemonset_doc as daemonset_doc
from kubedocs import node_doc as node_doc
from kubedocs import pod_doc as pod_doc
from kubesmp import SMP as SMP
from kubesmp import PatchRefused as PatchRefused
from kubesmp import strategic_merge as strategic_merge

TOKEN = "upgrade-test-token"
STATE = "gpu-node-installer/upgrade-state"


@dataclass
class Call:
    """One request as the server saw it, with the Node's state right after it."""

    method: str
    path: str
    status: int
    body: Doc | None
    state: str | None
    unschedulable: bool
    observed: str = ""  # what `Cluster.observe` said at that moment (e.g. the loaded driver)
    at: float = 0.0  # time.monotonic() when it was answered


@dataclass
class Reply:
    """A scripted raw answer (see the module docstring)."""

    status: int = 200
    body: bytes = b""
    trickle_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Cluster:
    """The API's objects and script. `evictions[pod] = [429, 403, 201]` answers in turn
    (then 201; 403 is NamespaceTerminating); an eviction in a `terminating_namespaces`
    namespace always answers that 403, and the first one starts the pod's deletion (the
    namespace controller's part). `exits_after[pod]`: seconds its processes take to exit
    once told (None: they ignore SIGTERM until the grace period ends). `on_evict(pod)` runs
    when a pod goes (kubelet's part: kill its processes). Every DaemonSet that owns a pod
    given at construction exists unless the test removes it from `daemonsets`.
    `faults["GET /api/v1/nodes/n"] = [503]` fails that call in turn (then it is served);
    a `Reply` in that list is sent as it is."""

    nodes: dict[str, Doc] = field(default_factory=dict)
    pods: dict[str, Doc] = field(default_factory=dict)
    evictions: dict[str, list[int]] = field(default_factory=dict)
    faults: dict[str, list[int | Reply]] = field(default_factory=dict)
    daemonsets: dict[str, Doc] = field(default_factory=dict)
    exits_after: dict[str, float | None] = field(default_factory=dict)
    terminating_namespaces: set[str] = field(default_factory=set)
    on_evict: Callable[[Doc], None] = lambda pod: None
    observe: Callable[[], str] = lambda: ""
    calls: list[Call] = field(default_factory=list)
    events: list[Doc] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    node_name: str = "gpu-node-1"
    controllers: list[DaemonSet] = field(default_factory=list)  # see "DaemonSets" below
    leases: dict[str, Doc] = field(default_factory=dict)  # "namespace/name": tests/kubelease.py
    lease_version: int = 0
    jitter_s: float = 0.0  # each request waits up to this long, at random, before its answer
    lock: threading.Lock = field(default_factory=threading.Lock)
    timers: list[threading.Timer] = field(default_factory=list)

    def __post_init__(self) -> None:
        for pod in self.pods.values():
            for owner in pod["metadata"].get("ownerReferences", []):
                if owner["kind"] == "DaemonSet":
                    namespace = pod["metadata"]["namespace"]
                    self.daemonsets.setdefault(f"{namespace}/{owner['name']}",
                                               daemonset_doc(owner["name"], namespace))

    def node(self) -> Doc:
        return self.nodes[self.node_name]

    def states(self) -> list[str]:
        """The upgrade-state label's values in the order they were set (repeats merged)."""
        seen: list[str] = []
        for call in self.calls:
            if call.state and (not seen or seen[-1] != call.state):
                seen.append(call.state)
        return seen

    def steps(self) -> list[str]:
        """The calls that change something, named: what the order assertions read."""
        named = []
        for call in self.calls:
            if call.method == "PATCH":
                cordon = "cordoned" if call.unschedulable else "-"
                named.append(f"patch:{call.state or '-'}:{cordon}")
            elif call.path.endswith("/eviction"):
                named.append(f"evict:{call.path.split('/')[-2]}:{call.status}")
            elif call.method == "DELETE":
                named.append(f"delete:{call.path.split('/')[-1]}:{call.status}")
        return named


def _handler(cluster: Cluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if cluster.jitter_s:  # callers' requests interleave in another order each time
                time.sleep(random.uniform(0, cluster.jitter_s))
            with cluster.lock:
                status, reply, body = self._answer(raw)
                node = cluster.nodes.get(cluster.node_name, {})
                cluster.calls.append(Call(
                    self.command, urlsplit(self.path).path, status, body,
                    node.get("metadata", {}).get("labels", {}).get(STATE),
                    bool(node.get("spec", {}).get("unschedulable")), cluster.observe(),
                    time.monotonic()))
            if isinstance(reply, Reply):
                return self._raw(reply)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _raw(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for key, value in {"Content-Type": "application/json", **reply.headers}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            try:
                if not reply.trickle_s:
                    self.wfile.write(reply.body)
                    return
                self.wfile.flush()
                for value in reply.body:  # until done or the client hangs up
                    time.sleep(reply.trickle_s)
                    self.wfile.write(bytes([value]))
                    self.wfile.flush()
            except OSError:
                self.close_connection = True

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve

        def _answer(self, raw: bytes) -> tuple[int, Doc, Doc | None]:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._error(401, "Unauthorized", None)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return self._error(400, "body is not JSON", None)
            try:
                return _route(cluster, self.command, self.path, body,
                              self.headers.get("Content-Type", ""))
            except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
                return self._error(422, f"invalid: {exc}", body)

        def _error(self, status: int, message: str, body: Doc | None
                   ) -> tuple[int, Doc, Doc | None]:
            cluster.errors.append(f"{self.command} {self.path}: {status} {message[:300]}")
            return status, _status(status, message), body

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _status(code: int, message: str) -> Doc:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "message": message}


def _route(cluster: Cluster, method: str, url: str, body: Doc | None, content_type: str
           ) -> tuple[int, Doc, Doc | None]:
    split = urlsplit(url)
    parts = split.path.strip("/").split("/")
    query = {k: v[0] for k, v in parse_qs(split.query).items()}
    fault = cluster.faults.get(f"{method} {split.path}")
    if fault:
        scripted = fault.pop(0)
        if isinstance(scripted, Reply):
            return scripted.status, scripted, body  # type: ignore[return-value]
        return scripted, _status(scripted, "scripted fault"), body
    leased = kubelease.route(cluster, method, parts, body)
    if leased is not None:
        return leased
    if parts[:3] == ["api", "v1", "nodes"] and parts[4:] == ["status"]:
        return _node_status(cluster, method, parts[3], body, content_type)
    if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
        return _node(cluster, method, parts[3], body, content_type)
    if parts == ["api", "v1", "nodes"] and method == "GET":
        return 200, _list("NodeList", [n for n in cluster.nodes.values()
                                       if _selects(query.get("labelSelector", ""), n)]), None
    if parts == ["api", "v1", "pods"] and method == "GET":
        node = query.get("fieldSelector", "").removeprefix("spec.nodeName=")
        return 200, _list("PodList", [p for p in cluster.pods.values()
                                      if p["spec"]["nodeName"] == node]), None
    if parts == ["api", "v1", "namespaces", "default", "events"] and method == "POST":
        assert body is not None
        validate(body)
        cluster.events.append(body)
        return 201, body, body
    if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
        return _pod(cluster, method, parts, body)
    if (len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"]
            and parts[5] == "daemonsets" and method == "GET"):
        found = cluster.daemonsets.get(f"{parts[4]}/{parts[6]}")
        if found is None:
            return 404, _status(404, f'daemonsets.apps "{parts[6]}" not found'), None
        return 200, found, None
    cluster.errors.append(f"unexpected {method} {url}")
    return 404, _status(404, "not found"), body


def _node(cluster: Cluster, method: str, name: str, body: Doc | None, content_type: str
          ) -> tuple[int, Doc, Doc | None]:
    if name not in cluster.nodes:
        return 404, _status(404, f"nodes {name} not found"), body
    if method == "GET":
        return 200, _versioned(cluster.nodes[name]), None
    if method != "PATCH" or content_type != "application/merge-patch+json":
        cluster.errors.append(f"{method} node with {content_type}")
        return 415, _status(415, "unsupported"), body
    stored = _versioned(cluster.nodes[name])
    patched = merge_patch(stored, body)
    if patched["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
        return 409, _status(409, f'Operation cannot be fulfilled on nodes "{name}": '
                                 f"{OPTIMISTIC_LOCK}"), body
    validate(patched)
    cluster.nodes[name] = _bump(patched)
    _daemonsets_reconcile(cluster)
    return 200, patched, body


# --- resourceVersion: optimistic concurrency on the Node -----------------------------------
# Every write gives the Node a new resourceVersion. A patch that carries
# `metadata.resourceVersion` writes only if it is still the stored one, else 409 Conflict
# with the API's message: kubernetes/kubernetes@f565665e0604a5aebe7116339096b961becf7e23,
# staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go (Store.Update:
# `newResourceVersion != existingResourceVersion` -> NewConflict(OptimisticLockErrorMsg));
# a merge patch without one is applied to the current object unconditionally (patch.go).
OPTIMISTIC_LOCK = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


def _versioned(node: Doc) -> Doc:
    """The Node with a resourceVersion (nodes built by node_doc start without one)."""
    node["metadata"].setdefault("resourceVersion", "1")
    return node


def _bump(node: Doc) -> Doc:
    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
    return node


def _pod(cluster: Cluster, method: str, parts: list[str], body: Doc | None
         ) -> tuple[int, Doc, Doc | None]:
    namespace, name = parts[3], parts[5]
    key = f"{namespace}/{name}"
    pod = cluster.pods.get(key)
    if parts[6:] == [] and method == "GET":
        if pod is None:
            return 404, _status(404, f'pods "{name}" not found'), None
        return 200, pod, None
    if parts[6:] == ["eviction"] and method == "POST":
        assert body is not None
        validate(body)
        if body["metadata"] != {"name": name, "namespace": namespace}:
            return 400, _status(400, "eviction names another pod"), body
        if pod is None:
            return 404, _status(404, f"pods {name} not found"), body
        script = cluster.evictions.get(key, [])
        code = script.pop(0) if script else 201
        if namespace in cluster.terminating_namespaces:
            code = 403
            _terminate(cluster, key, None)  # the namespace controller deletes every pod
        if code == 403:
            return code, namespace_terminating(namespace, name), body
        options = body.get("deleteOptions", {})
        if code == 201 and not _uid_holds(options, pod):
            return 409, _uid_conflict(namespace, name, options, pod), body
        if code == 201:
            _terminate(cluster, key, options.get("gracePeriodSeconds"))
        return code, _status(code, "scripted") if code != 201 else body, body
    if parts[6:] == [] and method == "DELETE":
        assert body is not None
        validate_delete_options(body)
        if pod is None:
            return 404, _status(404, f"pods {name} not found"), body
        if not _uid_holds(body, pod):
            return 409, _uid_conflict(namespace, name, body, pod), body
        _terminate(cluster, key, body.get("gracePeriodSeconds"))
        return 200, cluster.pods.get(key, pod), body
    cluster.errors.append(f"unexpected {method} {'/'.join(parts)}")
    return 404, _status(404, "not found"), body


# --- A UID precondition (DeleteOptions.preconditions.uid, on a delete or an Eviction) ------
# The Eviction API checks the PodDisruptionBudget first (a 429 stays a 429), then deletes
# through the store with the request's DeleteOptions: kubernetes/kubernetes@01aa0f3f6052c98
# 66dcb69054d8924fa8c96e3cb, pkg/registry/core/pod/storage/eviction.go (EvictionREST.Create:
# r.store.Delete(ctx, eviction.Name, ..., deleteOptions)). The store refuses a UID that is
# not the stored object's (etcd3 store.go checkPreconditions: "Precondition failed: UID in
# precondition: %v, UID in object meta: %v", an InvalidObjError), which the registry turns
# into 409 Conflict: @008b3652959ca58af8be3fb5b6ecfe9ae7638282,
# staging/src/k8s.io/apiserver/pkg/storage/errors/storage.go (InterpretDeleteError).


def _uid_holds(options: Doc, pod: Doc) -> bool:
    wanted = (options.get("preconditions") or {}).get("uid")
    return wanted is None or wanted == pod["metadata"]["uid"]


def _uid_conflict(namespace: str, name: str, options: Doc, pod: Doc) -> Doc:
    detail = (f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/"
              f"{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in "
              f"precondition: {options['preconditions']['uid']}, UID in object meta: "
              f"{pod['metadata']['uid']}")
    return {**_status(409, f'Operation cannot be fulfilled on pods "{name}": {detail}'),
            "reason": "Conflict", "details": {"name": name, "kind": "pods"}}


def _terminate(cluster: Cluster, key: str, grace: int | None) -> None:
    """Start the pod's graceful deletion (once): Terminating until its processes exit."""
    pod = cluster.pods[key]
    meta = pod["metadata"]
    if meta.get("deletionTimestamp"):
        return  # already terminating: its deletion goes on as it started
    if grace is None:
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    meta["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta["deletionGracePeriodSeconds"] = grace
    validate(pod)
    exits = cluster.exits_after.get(key, 0.0)
    delay = grace if exits is None else min(exits, grace)
    if delay <= 0:
        _remove(cluster, key, meta["uid"])
        return
    def kubelet() -> None:
        with cluster.lock:
            _remove(cluster, key, meta["uid"])

    timer = threading.Timer(delay, kubelet)
    timer.daemon = True
    cluster.timers.append(timer)
    timer.start()


def _remove(cluster: Cluster, key: str, uid: str) -> None:
    """The pod's processes have ended: kubelet's part runs and the API forgets the pod."""
    pod = cluster.pods.get(key)
    if pod is not None and pod["metadata"]["uid"] == uid:
        del cluster.pods[key]
        cluster.on_evict(pod)
        _daemonset_pod_gone(cluster, pod)


def _list(kind: str, items: list[Doc]) -> Doc:
    return {"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items}


def _selects(selector: str, obj: Doc) -> bool:
    """The two label-selector forms the installer sends: `key` and `key in (a,b)`."""
    labels = obj.get("metadata", {}).get("labels", {})
    if not selector:
        return True
    key, _, values = selector.partition(" in ")
    if not values:
        return key in labels
    return labels.get(key) in values.strip("()").split(",")


# --- DaemonSets: a controller that puts a deleted pod straight back ---------------------
# The DaemonSet controller keeps one pod per node whose labels match the DaemonSet's
# nodeSelector: a deleted pod comes back after `recreate_after` seconds with a new UID and
# the same owner (what makes "delete the device plugin's pod" not enough on a real
# cluster), and a node label that stops matching (gpu-operator's paused-for-driver-upgrade)
# removes the pod; matching again brings it back. `on_create(pod)` is kubelet starting the
# new pod's containers (the tests start a device-plugin stand-in there). Pods are made
# through `pod_doc`, so they are validated like every other pod the fake serves.


@dataclass
class DaemonSet:
    """One DaemonSet: its pods are `<name>-<n>` in `namespace` on the cluster's node."""

    namespace: str
    name: str
    node_selector: dict[str, str] = field(default_factory=dict)
    recreate_after: float = 0.2
    on_create: Callable[[Doc], None] = lambda pod: None
    empty_dirs: tuple[str, ...] = ()  # emptyDir volumes of its pods
    uid: str = ""
    made: list[str] = field(default_factory=list)  # every pod name it created, in order

    def __post_init__(self) -> None:
        self.uid = self.uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.namespace}/"
                                              f"{self.name}"))

    def owns(self, pod: Doc) -> bool:
        return any(ref.get("uid") == self.uid
                   for ref in pod["metadata"].get("ownerReferences", []))

    def selects(self, node: Doc) -> bool:
        labels = node.get("metadata", {}).get("labels", {})
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def new_pod(self, node: str, uid: str | None = None) -> Doc:
        """A pod as the controller makes it: owned by this DaemonSet, with its selector."""
        name = f"{self.name}-{len(self.made) + 1:05d}"
        self.made.append(name)
        doc = pod_doc(name, uid or str(uuid.uuid4()), node, namespace=self.namespace,
                      owner="DaemonSet", empty_dirs=self.empty_dirs)
        doc["metadata"]["ownerReferences"][0].update(name=self.name, uid=self.uid)
        if self.node_selector:
            doc["spec"]["nodeSelector"] = dict(self.node_selector)
        validate(doc)
        return doc


def add_daemonset(cluster: Cluster, daemonset: DaemonSet, uid: str | None = None) -> Doc:
    """Register `daemonset` with its pod on the cluster's node already running (`uid`)."""
    cluster.controllers.append(daemonset)
    cluster.daemonsets.setdefault(f"{daemonset.namespace}/{daemonset.name}",
                                  daemonset_doc(daemonset.name, daemonset.namespace))
    pod = daemonset.new_pod(cluster.node_name, uid)
    cluster.pods[f"{daemonset.namespace}/{pod['metadata']['name']}"] = pod
    return pod


def _daemonset_of(cluster: Cluster, pod: Doc) -> DaemonSet | None:
    return next((d for d in cluster.controllers if d.owns(pod)), None)


def _daemonset_pod_gone(cluster: Cluster, pod: Doc) -> None:
    """Called under the lock: schedule the replacement while the node still matches."""
    daemonset = _daemonset_of(cluster, pod)
    if daemonset is not None:
        _later(cluster, daemonset, daemonset.recreate_after)


def _daemonsets_reconcile(cluster: Cluster) -> None:
    """Called under the lock after a node patch: unselected pods go, selected ones come."""
    node = cluster.nodes.get(cluster.node_name, {})
    for daemonset in cluster.controllers:
        mine = [k for k, p in cluster.pods.items() if daemonset.owns(p)]
        if not daemonset.selects(node):
            for key in mine:
                _remove(cluster, key, cluster.pods[key]["metadata"]["uid"])  # kubelet stops it
        elif not mine:
            _later(cluster, daemonset, daemonset.recreate_after)


def _later(cluster: Cluster, daemonset: DaemonSet, delay: float) -> None:
    """The controller's next sync: one pod if the node matches and none is there. With no
    delay it happens within the request that removed the pod (under the lock: the
    controller always wins the race against the caller's next look)."""
    def sync() -> Doc | None:
        node = cluster.nodes.get(cluster.node_name, {})
        if not daemonset.selects(node) or any(daemonset.owns(p)
                                              for p in cluster.pods.values()):
            return None
        pod = daemonset.new_pod(cluster.node_name)
        cluster.pods[f"{daemonset.namespace}/{pod['metadata']['name']}"] = pod
        return pod

    def locked() -> None:
        with cluster.lock:
            pod = sync()
        if pod is not None:
            daemonset.on_create(pod)

    if delay <= 0:
        pod = sync()
        if pod is not None:
            daemonset.on_create(pod)
        return
    timer = threading.Timer(delay, locked)
    timer.daemon = True
    timer.start()


# --- The Node's status subresource (GPU health conditions) ---------------------------------
# PATCH /api/v1/nodes/<n>/status with a strategic merge patch (tests/kubesmp.py), as
# kubelet and node-problem-detector send theirs: only `status` may be patched. Anything
# else (another content type, another directive, a condition without `type`) is refused
# and recorded.

def _node_status(cluster: Cluster, method: str, name: str, body: Doc | None,
                 content_type: str) -> tuple[int, Doc, Doc | None]:
    if name not in cluster.nodes:
        return 404, _status(404, f"nodes {name} not found"), body
    if method == "GET":
        return 200, cluster.nodes[name], None
    if method != "PATCH" or content_type != SMP:
        cluster.errors.append(f"{method} node status with {content_type}")
        return 415, _status(415, "unsupported"), body
    if not isinstance(body, dict) or set(body) != {"status"}:
        cluster.errors.append(f"node status patch touches more than status: {body}")
        return 400, _status(400, "only status may be patched here"), body
    try:
        patched = strategic_merge(cluster.nodes[name], body)
    except PatchRefused as exc:
        cluster.errors.append(f"PATCH node status: {exc}")
        return 400, _status(400, str(exc)), body
    validate(patched)
    cluster.nodes[name] = _bump(_versioned(patched))
    return 200, patched, body


def conditions(cluster: Cluster, node: str | None = None) -> dict[str, Doc]:
    """The Node's status conditions by type."""
    found = cluster.nodes[node or cluster.node_name].get("status", {}).get("conditions", [])
    return {c["type"]: c for c in found}


@contextmanager
def serve(cluster: Cluster, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """The server's base URL while the block runs (127.0.0.1 only, any free port); https
    with `tls` (certificate, key)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cluster))
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        for timer in cluster.timers:
            timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
