"""A minimal Kubernetes API client: this node (labels, cordon, conditions), pods, Events.

A handful of calls, so no client library: HTTP/1.1 on the standard library
(`installer.node.kubehttp`) with the pod's service-account token (re-read on every call,
since kubelet rotates it) and the cluster CA. Every call has one overall deadline
(`deadline`, a time.monotonic() value; default DEFAULT_DEADLINE_S from now), retries
included; label, condition and Event writes retry 429 and 5xx with backoff inside it. A
2xx answer that is not a JSON object, or a list whose `items` is not a list of objects, is
a KubeError (Malformed) naming the answer. Used by the signal stage, the upgrade flow
(`installer.upgrade.flow`) and the agent, hence a shared room.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from installer.config import Config
from installer.node import kubehttp
from installer.node.kubehttp import KubeError as KubeError
from installer.node.kubehttp import Late as Late
from installer.node.kubehttp import Malformed as Malformed

COMPONENT = "gpu-node-installer"
DEFAULT_DEADLINE_S = 15.0  # one call, retries included, unless the caller gives a deadline
PAGE = 250
MAX_PAGES = 200  # 50,000 pods or nodes: far beyond one node, bounded all the same
NAMESPACE_TERMINATING = "NamespaceTerminating"  # the cause of a 403 in a namespace going away
BACKOFF_S = (0.2, 5.0)  # first and largest wait between tries of a write


@dataclass(frozen=True)
class ApiServer:
    """Where the API server is, how to authenticate to it, the proxy to reach it through
    (None: direct, whatever HTTPS_PROXY says), and `until`: a deadline no call through
    this value may pass (`bounded`), named by `until_name` in the error."""

    base_url: str
    token_file: Path
    ca_file: Path | None
    proxy: str | None = None
    until: float | None = None
    until_name: str = ""

    def bounded(self, until: float, name: str) -> ApiServer:
        """The same server, every call ending by `until` (e.g. the upgrade's deadline)."""
        return replace(self, until=until, until_name=name)

    def _headers(self, content_type: str, length: int) -> bytes:
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeError(f"cannot read the service-account token: {exc}") from exc
        if not token.isprintable() or not token.isascii():
            raise KubeError("the service-account token holds characters a header cannot")
        server = kubehttp.target(self.base_url)
        lines = [f"Host: {server.authority}", f"Authorization: Bearer {token}",
                 f"Content-Type: {content_type}", "Accept: application/json",
                 f"User-Agent: {COMPONENT}", "Connection: close",
                 f"Content-Length: {length}"]
        if self.proxy and server.scheme == "http":
            lines += kubehttp.proxy_authorization(kubehttp.target(self.proxy))
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def call(self, method: str, path: str, body: Mapping[str, Any] | None, content_type: str,
             *, deadline: float | None = None, retry: bool = False) -> dict[str, Any]:
        """One request, its answer decoded; KubeError for any failure, a non-2xx answer or
        a 2xx answer that is not a JSON object. With `retry`, 429 and 5xx answers are tried
        again with backoff until `deadline`."""
        end, bound = self._deadline(deadline)
        data = b"" if body is None else json.dumps(body).encode("utf-8")
        for attempt in range(1000):
            try:
                return self._once(method, path, data, content_type, end)
            except Late as exc:
                raise Late(f"{method} {path}: {exc}" + (f" ({bound} ran out)" if bound else ""),
                           bound) from exc
            except KubeError as exc:
                wait = _backoff(exc, attempt) if retry else None
                if wait is None or time.monotonic() + wait >= end:
                    raise
                time.sleep(wait)
        raise KubeError(f"{method} {path}: too many tries")

    def _deadline(self, deadline: float | None) -> tuple[float, str]:
        """The call's deadline, and the name of the bound when `until` set it."""
        end = time.monotonic() + DEFAULT_DEADLINE_S if deadline is None else deadline
        if self.until is not None and self.until <= end:
            return self.until, self.until_name
        return end, ""

    def _once(self, method: str, path: str, data: bytes, content_type: str, end: float
              ) -> dict[str, Any]:
        server = kubehttp.target(self.base_url)
        proxy = kubehttp.target(self.proxy) if self.proxy else None
        where = f"{method} {path}"
        try:
            answer = kubehttp.exchange(server, proxy, self.ca_file, method, server.path + path,
                                       self._headers(content_type, len(data)), data,
                                       deadline=end)
        except Late:
            raise
        except KubeError as exc:
            raise KubeError(f"{where}: {exc}", exc.status, exc.causes) from exc
        if not 200 <= answer.status < 300:
            text = answer.body[:4096].decode("utf-8", "replace")
            raise KubeError(f"{where}: HTTP {answer.status}: {kubehttp.shown(answer.body)}",
                            answer.status, _status_causes(text), answer.retry_after)
        return kubehttp.decode(answer.body, where)


def _backoff(exc: KubeError, attempt: int) -> float | None:
    """How long to wait before the next try of a write, or None when it is not retried."""
    if exc.status is None or (exc.status != 429 and exc.status < 500):
        return None  # no answer (nothing listens, TLS refused) or a refusal: not retried
    if exc.retry_after is not None:
        return min(exc.retry_after, BACKOFF_S[1] * 2)
    first, most = BACKOFF_S
    wait: float = min(most, first * 2.0 ** min(attempt, 10))
    return wait * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret


def _status_causes(text: str) -> tuple[str, ...]:
    """The reasons a meta/v1 Status names (`reason`, `details.causes[].reason`), if any."""
    try:
        status = json.loads(text)
    except (ValueError, RecursionError):
        return ()
    if not isinstance(status, dict):
        return ()
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    found = [status.get("reason")] + [c.get("reason") for c in (
        causes if isinstance(causes, list) else []) if isinstance(c, dict)]
    return tuple(str(reason) for reason in found if reason)


def connect(config: Config, environ: Mapping[str, str]) -> ApiServer | None:
    """The API server as configured (URL, service account, proxy), or None (see
    `api_server`)."""
    return api_server(config.kube_api, config.service_account_dir, environ,
                      proxy=config.kube_api_proxy)


def api_server(base_url: str | None, service_account_dir: Path,
               environ: Mapping[str, str], *, proxy: str | None = None) -> ApiServer | None:
    """The in-cluster API server, or None when there is no URL or no token to use."""
    url = base_url or _url_from_env(environ)
    token = service_account_dir / "token"
    if url is None or not token.is_file():
        return None
    ca = service_account_dir / "ca.crt"
    return ApiServer(url, token, ca if ca.is_file() else None, proxy)


def own_namespace(api: ApiServer) -> str:
    """The pod's namespace: the service account's `namespace` file beside its token (kubelet
    mounts both); `default` for a run by hand with a token alone."""
    try:
        found = (api.token_file.parent / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        return "default"
    return found if re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", found) else "default"


def _url_from_env(environ: Mapping[str, str]) -> str | None:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def patch_node_labels(api: ApiServer, node: str, labels: Mapping[str, str], *,
                      deadline: float | None = None) -> None:
    """Merge-patch the node's labels (others' labels are left alone); retried."""
    patch_node(api, node, {"metadata": {"labels": dict(labels)}}, deadline=deadline)


def patch_node(api: ApiServer, node: str, body: Mapping[str, Any], *,
               deadline: float | None = None) -> None:
    """One JSON merge patch of the Node (null values remove keys); retried (idempotent)."""
    api.call("PATCH", f"/api/v1/nodes/{node}", body, "application/merge-patch+json",
             deadline=deadline, retry=True)


def patch_node_status(api: ApiServer, node: str, conditions: list[dict[str, Any]], *,
                      deadline: float | None = None) -> None:
    """Set or delete (`{"type": t, "$patch": "delete"}`) some of the Node's conditions.

    Conditions live in the status subresource. A strategic merge patch merges
    `status.conditions` by `type`, as kubelet and node-problem-detector write theirs, so
    only the conditions named here change and no one else's are read back and overwritten.
    Retried, as the patch is idempotent.
    """
    api.call("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": conditions}},
             "application/strategic-merge-patch+json", deadline=deadline, retry=True)


def node_conditions(api: ApiServer, node: str, *,
                    deadline: float | None = None) -> list[dict[str, Any]]:
    """The Node's status.conditions as the API returns them (no type checked)."""
    status = get_node(api, node, deadline=deadline).get("status")
    found = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def get_node(api: ApiServer, node: str, *, deadline: float | None = None) -> dict[str, Any]:
    """The Node object as the API returns it."""
    return api.call("GET", f"/api/v1/nodes/{node}", None, "application/json",
                    deadline=deadline)


def node_metadata(api: ApiServer, node: str, *, deadline: float | None = None
                  ) -> tuple[dict[str, str], dict[str, str]]:
    """The Node's current labels and annotations (to find our stale labels)."""
    answer = get_node(api, node, deadline=deadline)
    metadata = answer.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}

    def strings(name: str) -> dict[str, str]:
        found = metadata.get(name)
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    return strings("labels"), strings("annotations")


def post_node_event(api: ApiServer, node: str, *, reason: str, message: str,
                    event_type: str = "Normal", deadline: float | None = None) -> None:
    """A core/v1 Event on the node (in `default`, where kubelet puts node events); retried
    (an Event posted twice after a lost answer is a lesser harm than one never posted)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node}.{COMPONENT}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason, "message": message[:1024], "type": event_type,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT, "reportingInstance": node,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    api.call("POST", "/api/v1/namespaces/default/events", event, "application/json",
             deadline=deadline, retry=True)


def list_items(api: ApiServer, path: str, *, deadline: float | None = None,
               **query: str) -> list[dict[str, Any]]:
    """Every item of a list call, following `continue` tokens (bounded pages, one deadline
    for them all). An answer whose `items` is not a list of objects is a KubeError."""
    end = time.monotonic() + DEFAULT_DEADLINE_S if deadline is None else deadline
    items: list[dict[str, Any]] = []
    token = ""
    for _ in range(MAX_PAGES):
        params = {**query, "limit": str(PAGE), **({"continue": token} if token else {})}
        answer = api.call("GET", f"{path}?{urlencode(params)}", None, "application/json",
                          deadline=end)
        items += _items(answer, path)
        metadata = answer.get("metadata")
        token = metadata.get("continue") or "" if isinstance(metadata, dict) else ""
        if not isinstance(token, str):
            raise Malformed(f"GET {path}: the answer's metadata.continue is a "
                            f"{type(token).__name__}, not a string")
        if not token:
            return items
    raise KubeError(f"GET {path}: more than {MAX_PAGES} pages")


def _items(answer: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """A list answer's items, or KubeError naming what came instead."""
    found = answer.get("items")
    if not isinstance(found, list):
        raise Malformed(f"GET {path}: the answer's items is "
                        f"{'missing' if found is None else 'a ' + type(found).__name__}, "
                        f"not a list: {kubehttp.shown(json.dumps(answer).encode())}")
    for odd in (item for item in found if not isinstance(item, dict)):
        raise Malformed(f"GET {path}: an item of the answer is a {type(odd).__name__}, "
                        f"not an object: {kubehttp.shown(json.dumps(odd).encode())}")
    return found


def pods_on_node(api: ApiServer, node: str, *,
                 deadline: float | None = None) -> list[dict[str, Any]]:
    """Every pod bound to `node` (`spec.nodeName`), in any namespace."""
    return list_items(api, "/api/v1/pods", deadline=deadline,
                      fieldSelector=f"spec.nodeName={node}")


def get_pod(api: ApiServer, namespace: str, name: str, *,
            deadline: float | None = None) -> dict[str, Any] | None:
    """One pod as the API has it now, or None once it is gone (404)."""
    try:
        return api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", None,
                        "application/json", deadline=deadline)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def daemonset_exists(api: ApiServer, namespace: str, name: str, *,
                     deadline: float | None = None) -> bool:
    """Whether the DaemonSet (apps/v1) still exists: a pod whose DaemonSet is gone has no
    controller to recreate it."""
    try:
        api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}", None,
                 "application/json", deadline=deadline)
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def evict(api: ApiServer, namespace: str, name: str, uid: str, grace_s: int | None, *,
          deadline: float | None = None) -> str:
    """Ask the Eviction API (policy/v1) to evict a pod, only if it is still the one we saw
    (a UID precondition): `evicted`, `refused` (429: a PodDisruptionBudget does not allow
    it now), `namespace-terminating` (403 with that cause: the namespace is being deleted,
    and the API creates nothing in it, evictions included), `gone` (404: it no longer
    exists) or `replaced` (409: another pod now has its name, e.g. a StatefulSet's). Not
    retried here: the caller's loop retries a refusal until its own deadline."""
    options: dict[str, Any] = {"preconditions": {"uid": uid}}
    if grace_s is not None:
        options["gracePeriodSeconds"] = grace_s
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace},
                            "deleteOptions": options}
    try:
        api.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body,
                 "application/json", deadline=deadline)
    except KubeError as exc:
        if exc.status == 429:
            return "refused"
        if exc.status == 403 and NAMESPACE_TERMINATING in exc.causes:
            return "namespace-terminating"
        if exc.status == 404:
            return "gone"
        if exc.status == 409:
            return "replaced"
        raise
    return "evicted"


def delete_pod(api: ApiServer, namespace: str, name: str, uid: str,
               grace_s: int | None, *, deadline: float | None = None) -> str:
    """Delete one pod, only if it is still the one we saw (a UID precondition):
    `deleted` or `gone`."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": uid}}
    if grace_s is not None:
        body["gracePeriodSeconds"] = grace_s
    try:
        api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body,
                 "application/json", deadline=deadline)
    except KubeError as exc:
        if exc.status in (404, 409):  # gone, or replaced by a pod of the same name
            return "gone"
        raise
    return "deleted"
