"""A minimal Kubernetes API client: this node (labels, cordon, conditions), pods, Events.

A handful of calls, so no client library: `requests` with the pod's service-account token
(re-read on every call, since kubelet rotates it) and the cluster CA. Used by the signal
stage, the upgrade flow (`installer.upgrade.flow`) and the agent's GPU health
(`installer.agent.health`: a node condition), hence a shared room. Imported
only when a node name is configured, so `import installer.cli` never loads `requests`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests

COMPONENT = "gpu-node-installer"
TIMEOUT_S = 5.0
MAX_PAGES = 100  # 50,000 pods or nodes: far beyond one node, bounded all the same
NAMESPACE_TERMINATING = "NamespaceTerminating"  # the cause of a 403 in a namespace going away


class KubeError(Exception):
    """An API call failed (`status`: the HTTP status, None when no answer came; `causes`:
    the reasons the answer's Status gave, its own and its details' causes, such as
    `Forbidden` and `NamespaceTerminating`)."""

    def __init__(self, message: str, status: int | None = None,
                 causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.causes = causes


@dataclass(frozen=True)
class ApiServer:
    """Where the API server is and how to authenticate to it."""

    base_url: str
    token_file: Path
    ca_file: Path | None

    def _headers(self, content_type: str) -> dict[str, str]:
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeError(f"cannot read the service-account token: {exc}") from exc
        return {"Authorization": f"Bearer {token}", "Content-Type": content_type,
                "Accept": "application/json", "User-Agent": COMPONENT}

    def call(self, method: str, path: str, body: Mapping[str, Any] | None, content_type: str
             ) -> dict[str, Any]:
        """One request; any transport error or non-2xx answer is a KubeError."""
        verify: bool | str = str(self.ca_file) if self.ca_file else True
        try:
            response = requests.request(
                method, self.base_url + path, data=None if body is None else json.dumps(body),
                headers=self._headers(content_type), verify=verify, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise KubeError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise KubeError(f"{method} {path}: HTTP {response.status_code}: "
                            f"{response.text.strip()[:200]}", response.status_code,
                            _status_causes(response.text))
        try:
            answer = response.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}


def _status_causes(text: str) -> tuple[str, ...]:
    """The reasons a meta/v1 Status names (`reason`, `details.causes[].reason`), if any."""
    try:
        status = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(status, dict):
        return ()
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    found = [status.get("reason")] + [c.get("reason") for c in causes or []
                                      if isinstance(c, dict)]
    return tuple(str(reason) for reason in found if reason)


def api_server(base_url: str | None, service_account_dir: Path,
               environ: Mapping[str, str]) -> ApiServer | None:
    """The in-cluster API server, or None when there is no URL or no token to use."""
    url = base_url or _url_from_env(environ)
    token = service_account_dir / "token"
    if url is None or not token.is_file():
        return None
    ca = service_account_dir / "ca.crt"
    return ApiServer(url, token, ca if ca.is_file() else None)


def _url_from_env(environ: Mapping[str, str]) -> str | None:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def patch_node_labels(api: ApiServer, node: str, labels: Mapping[str, str]) -> None:
    """Merge-patch the node's labels (others' labels are left alone)."""
    patch_node(api, node, {"metadata": {"labels": dict(labels)}})


def patch_node(api: ApiServer, node: str, body: Mapping[str, Any]) -> None:
    """One JSON merge patch of the Node (null values remove keys)."""
    api.call("PATCH", f"/api/v1/nodes/{node}", body, "application/merge-patch+json")


def patch_node_status(api: ApiServer, node: str, conditions: list[dict[str, Any]]) -> None:
    """Set or delete (`{"type": t, "$patch": "delete"}`) some of the Node's conditions.

    Conditions live in the status subresource. A strategic merge patch merges
    `status.conditions` by `type`, as kubelet and node-problem-detector write theirs, so
    only the conditions named here change and no one else's are read back and overwritten.
    """
    api.call("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": conditions}},
             "application/strategic-merge-patch+json")


def node_conditions(api: ApiServer, node: str) -> list[dict[str, Any]]:
    """The Node's status.conditions as the API returns them (no type checked)."""
    status = get_node(api, node).get("status")
    found = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def get_node(api: ApiServer, node: str) -> dict[str, Any]:
    """The Node object as the API returns it."""
    return api.call("GET", f"/api/v1/nodes/{node}", None, "application/json")


def node_metadata(api: ApiServer, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """The Node's current labels and annotations (to find our stale labels)."""
    answer = get_node(api, node)
    metadata = answer.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}

    def strings(name: str) -> dict[str, str]:
        found = metadata.get(name)
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    return strings("labels"), strings("annotations")


def post_node_event(api: ApiServer, node: str, *, reason: str, message: str,
                    event_type: str = "Normal") -> None:
    """A core/v1 Event on the node (in `default`, where kubelet puts node events)."""
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
    api.call("POST", "/api/v1/namespaces/default/events", event, "application/json")


def list_items(api: ApiServer, path: str, **query: str) -> list[dict[str, Any]]:
    """Every item of a list call, following `continue` tokens (bounded pages)."""
    items: list[dict[str, Any]] = []
    token = ""
    for _ in range(MAX_PAGES):
        params = {**query, "limit": "500", **({"continue": token} if token else {})}
        answer = api.call("GET", f"{path}?{urlencode(params)}", None, "application/json")
        found = answer.get("items")
        items += [item for item in found if isinstance(item, dict)] if isinstance(
            found, list) else []
        metadata = answer.get("metadata")
        token = str(metadata.get("continue") or "") if isinstance(metadata, dict) else ""
        if not token:
            return items
    raise KubeError(f"GET {path}: more than {MAX_PAGES} pages")


def pods_on_node(api: ApiServer, node: str) -> list[dict[str, Any]]:
    """Every pod bound to `node` (`spec.nodeName`), in any namespace."""
    return list_items(api, "/api/v1/pods", fieldSelector=f"spec.nodeName={node}")


def get_pod(api: ApiServer, namespace: str, name: str) -> dict[str, Any] | None:
    """One pod as the API has it now, or None once it is gone (404)."""
    try:
        return api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", None,
                        "application/json")
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def daemonset_exists(api: ApiServer, namespace: str, name: str) -> bool:
    """Whether the DaemonSet (apps/v1) still exists: a pod whose DaemonSet is gone has no
    controller to recreate it."""
    try:
        api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}", None,
                 "application/json")
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def evict(api: ApiServer, namespace: str, name: str, grace_s: int | None) -> str:
    """Ask the Eviction API (policy/v1) to evict a pod: `evicted`, `refused` (429: a
    PodDisruptionBudget does not allow it now), `namespace-terminating` (403 with that
    cause: the namespace is being deleted, and the API creates nothing in it, evictions
    included) or `gone` (404: it no longer exists)."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace}}
    if grace_s is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace_s}
    try:
        api.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body,
                 "application/json")
    except KubeError as exc:
        if exc.status == 429:
            return "refused"
        if exc.status == 403 and NAMESPACE_TERMINATING in exc.causes:
            return "namespace-terminating"
        if exc.status == 404:
            return "gone"
        raise
    return "evicted"


def delete_pod(api: ApiServer, namespace: str, name: str, uid: str,
               grace_s: int | None) -> str:
    """Delete one pod, only if it is still the one we saw (a UID precondition):
    `deleted` or `gone`."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": uid}}
    if grace_s is not None:
        body["gracePeriodSeconds"] = grace_s
    try:
        api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body,
                 "application/json")
    except KubeError as exc:
        if exc.status in (404, 409):  # gone, or replaced by a pod of the same name
            return "gone"
        raise
    return "deleted"
