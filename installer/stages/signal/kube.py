"""A minimal Kubernetes API client for the signal stage: label the node, post an Event.

Only two calls, so no client library: `requests` with the pod's service-account token
(re-read on every call, since kubelet rotates it) and the cluster CA. Imported only when a
node name is configured, so `import installer.cli` never loads `requests`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

COMPONENT = "gpu-node-installer"
TIMEOUT_S = 5.0


class KubeError(Exception):
    """An API call failed; the signal stage turns this into a warning."""


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
                            f"{response.text.strip()[:200]}")
        try:
            answer = response.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}


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


def node_metadata(api: ApiServer, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """The Node's current labels and annotations (to find our stale labels)."""
    answer = api.call("GET", f"/api/v1/nodes/{node}", None, "application/json")
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
