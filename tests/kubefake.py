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
from kubedocs import Doc, namespace_terminating, validate, validate_delete_options
from kubedocs import daemonset_doc as daemonset_doc
from kubedocs import node_doc as node_doc
from kubedocs import pod_doc as pod_doc
from kubenodes import OPTIMISTIC_LOCK as OPTIMISTIC_LOCK
from kubenodes import _node, _node_status, _status
from kubenodes import conditions as conditions
from kubepods import DaemonSet as DaemonSet
from kubepods import _terminate
from kubepods import add_daemonset as add_daemonset
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
    controllers: list[DaemonSet] = field(default_factory=list)  # see tests/kubepods.py
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
