"""Which containers hold which GPUs: the kubelet's PodResources API (v1), read only.

The kubelet serves `v1.PodResourcesLister/List` over gRPC on `<dir>/kubelet.sock` (the agent's
DaemonSet mounts the host's `/var/lib/kubelet/pod-resources` read-only); the agent's metrics
use it to label per-container GPU series with `namespace`, `pod` and `container`.

Neither grpcio nor protobuf's runtime: the agent's budget with metrics on is 60 MB of RSS, and
they would take about 20 and 2.5 MB of it. The call is one unary gRPC call over HTTP/2
(`installer.node.grpcunix`, on `h2`, loaded on the first call only, so an agent with metrics
off never loads it); its answer is decoded here from the protobuf wire format: the string
fields of six messages (`POD_RESOURCES`...: the API's numbers), unknown fields (topology,
CPUs, memory, CDI devices, whatever the kubelet adds) skipped by wire type as protobuf
parsers do. The kubelet lists each device in an entry of its own and every container; the
rows returned are one per (namespace, pod, container, resource), and one per device a DRA
driver allocated to a container (`dynamic_resources`). No generated code, so
nothing to regenerate or exempt from the linters. The test kubelet (tests/podresources.py)
is a real grpcio server encoding with the protobuf library, so each side checks the other.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SOCKET_NAME = "kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's own server limit for this API

# The fields we read, by number, of: ListPodResourcesResponse (pod_resources = 1),
# PodResources (name = 1, namespace = 2, containers = 3), ContainerResources (name = 1,
# devices = 2), ContainerDevices (resource_name = 1, device_ids = 2).
POD_RESOURCES, NAME, NAMESPACE, CONTAINERS, DEVICES, RESOURCE_NAME, DEVICE_IDS = 1, 1, 2, 3, 2, 1, 2
# ContainerResources (dynamic_resources = 5), DynamicResource (claim_name = 2, claim_namespace
# = 3, claim_resources = 4), ClaimResource (driver_name = 2, pool_name = 3, device_name = 4,
# optional share_id = 5).
DYNAMIC_RESOURCES, CLAIM_NAME, CLAIM_NAMESPACE, CLAIM_RESOURCES = 5, 2, 3, 4
DRIVER_NAME, POOL_NAME, DEVICE_NAME, SHARE_ID = 2, 3, 4, 5
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5  # wire types (3, 4: groups, not in proto3)


@dataclass(frozen=True)
class ContainerDevices:
    """One container's devices of one resource, as the device plugin named them."""

    namespace: str
    pod: str
    container: str
    resource: str  # e.g. "nvidia.com/gpu"
    device_ids: tuple[str, ...]  # "nvidia0" (GKE's plugin) or "GPU-<uuid>" (NVIDIA's)


@dataclass(frozen=True)
class ClaimDevice:
    """One device a DRA driver allocated to a container through a ResourceClaim."""

    namespace: str
    pod: str
    container: str
    claim: str  # "<claim namespace>/<claim name>"
    driver: str  # e.g. "gpu.nvidia.com"
    pool: str
    device: str  # the driver's name for it, e.g. "gpu-0"
    share_id: str | None = None  # set: the device is shared with other claims


Assignment = ContainerDevices | ClaimDevice


class PodResourcesUnavailable(Exception):
    """One line: why the per-container view is absent (no socket, permission, gRPC error)."""


def list_assignments(socket_dir: Path, *, timeout_s: float = 2.0) -> list[Assignment]:
    """`List` on <socket_dir>/kubelet.sock (PodResources v1); raises PodResourcesUnavailable."""
    socket = socket_dir / SOCKET_NAME
    _check_socket(socket)
    answer = _call(socket, timeout_s)
    try:
        return parse_response(answer)
    except ValueError as exc:
        raise PodResourcesUnavailable(
            f"{socket}: the answer to List is not a v1 ListPodResourcesResponse: {exc}") from None


def _check_socket(socket: Path) -> None:
    """A unix socket is there, or one line saying what is there instead."""
    mount = "mount the host's kubelet pod-resources directory (POD_RESOURCES_DIR)"
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        raise PodResourcesUnavailable(f"{socket} does not exist: {mount}") from None
    except OSError as exc:
        raise PodResourcesUnavailable(f"{socket}: {exc.strerror or exc}: {mount}") from None
    if not stat.S_ISSOCK(mode):
        raise PodResourcesUnavailable(f"{socket} is not a socket: {mount}")


def _call(socket: Path, timeout_s: float) -> bytes:
    """One unary `List` (an empty request) as gRPC over HTTP/2; the answer's message bytes,
    or PodResourcesUnavailable naming the gRPC status (or the transport's failure)."""
    from installer.node import grpcunix

    try:
        return grpcunix.unary_call(socket, LIST_METHOD, b"", timeout_s=timeout_s,
                                   max_message=MAX_MESSAGE)
    except grpcunix.GrpcError as exc:
        text = " ".join(exc.details.split())[:200]
        raise PodResourcesUnavailable(f"{socket}: PodResources List failed: {exc.status}: "
                                      f"{text or 'no details'}") from None


def parse_response(data: bytes) -> list[Assignment]:
    """Every (container, resource) holding at least one device, in the kubelet's order, then
    every device of a DRA claim per container; ValueError when the bytes are not such a
    message.

    The kubelet lists each device in an entry of its own, once per NUMA node of the device
    (`containerDevicesFromResourceDeviceInstances`), and every container, holding devices or
    not. Entries of one (namespace, pod, container, resource) are merged here, each device
    once, so that a container holding two GPUs is one row of two."""
    held: dict[tuple[str, str, str, str], dict[str, None]] = {}
    claimed: dict[ClaimDevice, None] = {}
    for pod in _messages(data, POD_RESOURCES):
        name, namespace = _string(pod, NAME), _string(pod, NAMESPACE)
        for container in _messages(pod, CONTAINERS):
            container_name = _string(container, NAME)
            for devices in _messages(container, DEVICES):
                ids = [_text(_bytes(w, v)) for n, w, v in _fields(devices) if n == DEVICE_IDS]
                if ids:
                    key = (namespace, name, container_name, _string(devices, RESOURCE_NAME))
                    held.setdefault(key, {}).update(dict.fromkeys(ids))
            for claim in _messages(container, DYNAMIC_RESOURCES):
                label = f"{_string(claim, CLAIM_NAMESPACE)}/{_string(claim, CLAIM_NAME)}"
                for resource in _messages(claim, CLAIM_RESOURCES):
                    shares = _messages(resource, SHARE_ID)
                    claimed[ClaimDevice(
                        namespace, name, container_name, label, _string(resource, DRIVER_NAME),
                        _string(resource, POOL_NAME), _string(resource, DEVICE_NAME),
                        _text(shares[-1]) if shares else None)] = None
    rows: list[Assignment] = [ContainerDevices(*key, tuple(ids)) for key, ids in held.items()]
    return rows + list(claimed)


def _messages(data: bytes, number: int) -> list[bytes]:
    return [_bytes(w, v) for n, w, v in _fields(data) if n == number]


def _string(data: bytes, number: int) -> str:
    """A singular string field: the last one wins, as in protobuf; absent is ""."""
    values = [_text(_bytes(w, v)) for n, w, v in _fields(data) if n == number]
    return values[-1] if values else ""


def _bytes(wire: int, value: bytes | int) -> bytes:
    """A known field's payload, which is length-delimited in all we read."""
    if wire != _LENGTH or isinstance(value, int):
        raise ValueError(f"a known field has wire type {wire}, not length-delimited")
    return value


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"a string is not UTF-8 ({exc.reason})") from None


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of each field of one message, unknown ones too."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
            continue
        if wire == _LENGTH:
            size, pos = _varint(data, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if pos + size > len(data):
            raise ValueError("a field runs past the end of its message")
        yield number, wire, data[pos:pos + size]
        pos += size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at `pos` (at most 10 bytes) and the position after it."""
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise ValueError("a varint runs past the end of its message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise ValueError("a varint longer than 10 bytes")
