"""Which containers hold which GPUs: the kubelet's PodResources API (v1), read only.

The kubelet serves `v1.PodResourcesLister/List` over gRPC on `<dir>/kubelet.sock`; the
agent's metrics use it to label per-container GPU series (`namespace`, `pod`, `container`).
The body is being written; the signatures below are the agreed interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOCKET_NAME = "kubelet.sock"


@dataclass(frozen=True)
class ContainerDevices:
    """One container's devices of one resource, as the device plugin named them."""

    namespace: str
    pod: str
    container: str
    resource: str  # e.g. "nvidia.com/gpu"
    device_ids: tuple[str, ...]  # "nvidia0" (GKE's plugin) or "GPU-<uuid>" (NVIDIA's)


class PodResourcesUnavailable(Exception):
    """One line: why the per-container view is absent (no socket, permission, gRPC error)."""


def list_assignments(socket_dir: Path, *, timeout_s: float = 2.0) -> list[ContainerDevices]:
    """`List` on <socket_dir>/kubelet.sock (PodResources v1); raises PodResourcesUnavailable."""
    raise PodResourcesUnavailable(f"{socket_dir / SOCKET_NAME}: client not written yet")
