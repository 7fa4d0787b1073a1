"""A kubelet stand-in for the PodResources API: a real gRPC server on a unix socket.

`serve(socket_dir, assignments)` listens on `<socket_dir>/kubelet.sock` and answers
`v1.PodResourcesLister/List` as a kubelet does, encoded by the protobuf library from a
descriptor of kubelet's v1 messages written here. The client (installer/node/podresources.py)
decodes the wire format itself, so the two implementations check each other. The yielded
`Kubelet` can change its pods, send raw bytes instead, fail with a gRPC status, or stall,
while the server runs.

What the answer holds, and in which shape, follows the kubelet's own sources:
- the messages, field names and numbers: `pkg/apis/podresources/v1/api.proto` of
  kubernetes/kubelet at 63b3249724f7d89a8aa48f9acb3811f193c9aa68 (pod-level `cpu_ids` and
  `memory`, `DynamicResource`, `ClaimResource` with its proto3-optional `share_id`);
- the answer's layout: `List` and `getContainerResources` in
  `pkg/kubelet/apis/podresources/server_v1.go` of kubernetes/kubernetes at
  b7fd57adba6fe4061aaa414adb353273e083a934: every active pod, every container of it (those
  holding nothing too), restartable init containers (sidecars) first, other init
  containers never; each container with its devices, exclusive CPUs, memory blocks and (with
  KubeletPodResourcesDynamicResources, on by default) its DRA claims;
- the devices: `containerDevicesFromResourceDeviceInstances` in `pkg/kubelet/cm/
  container_manager.go` at 001332b0422071acf4860769f18e34b5e9b7c1bc: ONE `ContainerDevices`
  per device (`DeviceIds: []string{devID}`), once per NUMA node of its topology (a device on
  two nodes is listed twice), once without topology where the plugin reported none; resources
  and devices come from Go maps, so their order varies from answer to answer (shuffled here);
- memory blocks and DRA claims: `containerMemoryFromBlock` and `GetDynamicResources` in
  `pkg/kubelet/cm/container_manager_linux.go` at the same commit: one `ClaimResource` per
  allocated device, grouped by driver, whose `cdi_devices` list also repeats the CDI ids of
  the driver's devices before it (the kubelet appends to one slice per driver).
"""

from __future__ import annotations

import functools
import random
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from installer.node import podresources
from installer.node.podresources import ContainerDevices

PACKAGE = "v1"
_F = descriptor_pb2.FieldDescriptorProto
_STRING, _MESSAGE, _INT64, _UINT64 = _F.TYPE_STRING, _F.TYPE_MESSAGE, _F.TYPE_INT64, \
    _F.TYPE_UINT64
_ONE, _MANY, _OPTIONAL = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED, "proto3 optional"
# message -> [(field, number, type, label, message type)], as kubelet's v1 api.proto has them
# (the messages `List` answers with; the other two RPCs are not served).
V1: dict[str, list[tuple[str, int, int, Any, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [("name", 1, _STRING, _ONE, ""), ("namespace", 2, _STRING, _ONE, ""),
                     ("containers", 3, _MESSAGE, _MANY, "ContainerResources"),
                     ("cpu_ids", 4, _INT64, _MANY, ""),
                     ("memory", 5, _MESSAGE, _MANY, "ContainerMemory")],
    "ContainerResources": [("name", 1, _STRING, _ONE, ""),
                           ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
                           ("cpu_ids", 3, _INT64, _MANY, ""),
                           ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
                           ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource")],
    "ContainerMemory": [("memory_type", 1, _STRING, _ONE, ""), ("size", 2, _UINT64, _ONE, ""),
                        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo")],
    "ContainerDevices": [("resource_name", 1, _STRING, _ONE, ""),
                         ("device_ids", 2, _STRING, _MANY, ""),
                         ("topology", 3, _MESSAGE, _ONE, "TopologyInfo")],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _ONE, "")],
    "DynamicResource": [("claim_name", 2, _STRING, _ONE, ""),
                        ("claim_namespace", 3, _STRING, _ONE, ""),
                        ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource")],
    "ClaimResource": [("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
                      ("driver_name", 2, _STRING, _ONE, ""), ("pool_name", 3, _STRING, _ONE, ""),
                      ("device_name", 4, _STRING, _ONE, ""),
                      ("share_id", 5, _STRING, _OPTIONAL, "")],
    "CDIDevice": [("name", 1, _STRING, _ONE, "")],
}


@dataclass(frozen=True)
class Device:
    """A device plugin's device as the kubelet's device manager holds it."""

    id: str
    numa: tuple[int, ...] | None = (0,)  # None: the plugin reported no topology


@dataclass(frozen=True)
class Memory:
    """A memory manager block (`memory`, `hugepages-1Gi`...) of `size` bytes."""

    memory_type: str
    size: int
    numa: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class DraDevice:
    """One device a DRA driver prepared for a claim."""

    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim the container uses, with its allocated devices."""

    name: str
    namespace: str
    devices: tuple[DraDevice, ...] = ()


@dataclass(frozen=True)
class Container:
    """A container of the pod spec and what the kubelet's managers assigned to it."""

    name: str
    devices: dict[str, tuple[Device, ...]] = field(default_factory=dict)  # resource -> devices
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[Memory, ...] = ()
    claims: tuple[Claim, ...] = ()
    init: str = ""  # "": a regular container; "sidecar" (restartPolicy Always) or "init"


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...]
    cpu_ids: tuple[int, ...] = ()  # pod-level exclusive CPUs
    memory: tuple[Memory, ...] = ()


def pods_of(assignments: list[ContainerDevices], numa: tuple[int, ...] | None = (0,)
            ) -> list[Pod]:
    """Pods from (container, resource, device ids) rows: first-seen order, a row with no
    ids still lists its container (holding nothing), every device on `numa`."""
    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    for row in assignments:
        containers = pods.setdefault((row.namespace, row.pod), {})
        resources = containers.setdefault(row.container, {})
        if row.device_ids:
            resources.setdefault(row.resource, []).extend(row.device_ids)
    return [Pod(namespace, name, tuple(
        Container(container, {resource: tuple(Device(i, numa) for i in dict.fromkeys(ids))
                              for resource, ids in resources.items()})
        for container, resources in containers.items()))
        for (namespace, name), containers in pods.items()]


@functools.cache
def messages() -> dict[str, Any]:
    """Message name -> protobuf class, from the descriptor above."""
    proto = descriptor_pb2.FileDescriptorProto(name="tests/podresources_v1.proto",
                                                package=PACKAGE, syntax="proto3")
    for message, fields in V1.items():
        described = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            optional = label == _OPTIONAL
            added = described.field.add(name=name, number=number, type=kind,
                                         label=_ONE if optional else label)
            if optional:  # proto3 `optional`: a synthetic one-field oneof, as protoc makes
                added.proto3_optional = True
                added.oneof_index = len(described.oneof_decl)
                described.oneof_decl.add(name=f"_{name}")
            if type_name:
                added.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"{PACKAGE}.{name}")) for name in V1}


def answer(pods: list[Pod], rng: random.Random | None = None) -> Any:
    """The ListPodResourcesResponse a kubelet builds for these pods; `rng` stands for Go's
    map order (None: the order given)."""
    response = messages()["ListPodResourcesResponse"]()
    for pod in pods:
        message = response.pod_resources.add(name=pod.name, namespace=pod.namespace,
                                              cpu_ids=list(pod.cpu_ids))
        _memory(message.memory, pod.memory)
        listed = [c for c in pod.containers if c.init == "sidecar"] + \
                 [c for c in pod.containers if not c.init]
        for container in listed:
            _container(message.containers.add(name=container.name, cpu_ids=list(
                container.cpu_ids)), container, rng)
    return response


def _shuffled(items: list[Any], rng: random.Random | None) -> list[Any]:
    if rng is not None:
        rng.shuffle(items)
    return items


def _container(message: Any, container: Container, rng: random.Random | None) -> None:
    """Devices one entry per device and NUMA node, memory blocks, DRA claims."""
    for resource in _shuffled(list(container.devices), rng):
        for device in _shuffled(list(container.devices[resource]), rng):
            if device.numa is None:
                message.devices.add(resource_name=resource, device_ids=[device.id])
            for node in device.numa or ():
                entry = message.devices.add(resource_name=resource, device_ids=[device.id])
                entry.topology.nodes.add(ID=node)
    _memory(message.memory, container.memory)
    for claim in container.claims:
        dynamic = message.dynamic_resources.add(claim_name=claim.name,
                                                claim_namespace=claim.namespace)
        drivers: dict[str, list[DraDevice]] = {}
        for device in claim.devices:
            drivers.setdefault(device.driver, []).append(device)
        for driver in _shuffled(list(drivers), rng):
            cdi: list[str] = []  # one slice per driver, as the kubelet's loop keeps it
            for device in drivers[driver]:
                cdi.extend(device.cdi_ids)
                resource = dynamic.claim_resources.add(driver_name=driver, pool_name=device.pool,
                                                       device_name=device.device)
                for name in cdi:
                    resource.cdi_devices.add(name=name)
                if device.share_id is not None:
                    resource.share_id = device.share_id


def _memory(repeated: Any, blocks: tuple[Memory, ...]) -> None:
    for block in blocks:
        entry = repeated.add(memory_type=block.memory_type, size=block.size)
        for node in block.numa:
            entry.topology.nodes.add(ID=node)


def encode(assignments: list[ContainerDevices] | list[Pod], numa_node: int | None = 0,
           seed: int | None = None) -> bytes:
    """The kubelet's answer as bytes, for rows (each device on `numa_node`) or pods."""
    pods = _as_pods(assignments, numa_node)
    rng = random.Random(seed) if seed is not None else None
    return bytes(answer(pods, rng).SerializeToString())


def _as_pods(given: list[ContainerDevices] | list[Pod], numa_node: int | None = 0) -> list[Pod]:
    if all(isinstance(p, Pod) for p in given):
        return list(given)  # type: ignore[arg-type]
    return pods_of(given, None if numa_node is None else (numa_node,))  # type: ignore[arg-type]


@dataclass
class Kubelet:
    """What the stand-in answers; tests may change these while it serves."""

    socket: Path
    pods: list[Pod]
    fail: grpc.StatusCode | None = None  # answer every List with this status
    stall: bool = False  # hold every List until the server stops (a hung kubelet)
    raw: bytes | None = None  # answer these bytes instead of the pods
    calls: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(0))  # Go's map order
    _released: threading.Event = field(default_factory=threading.Event)

    @property
    def assignments(self) -> list[ContainerDevices]:
        """The pods as (container, resource, device ids) rows, for reading back."""
        return [ContainerDevices(p.namespace, p.name, c.name, resource,
                                 tuple(d.id for d in devices))
                for p in self.pods for c in p.containers for resource, devices in
                c.devices.items()]

    @assignments.setter
    def assignments(self, rows: list[ContainerDevices] | list[Pod]) -> None:
        self.pods = _as_pods(rows)

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if request:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "List takes an empty request")
        if self.stall:
            self._released.wait(60)
        if self.fail is not None:
            context.abort(self.fail, "stand-in kubelet told to fail")
        if self.raw is not None:
            return self.raw
        return bytes(answer(self.pods, self.rng).SerializeToString())


def short_dir() -> Path:
    """A temp dir with a short path: a unix socket's path must fit in 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))


@contextmanager
def serve(socket_dir: Path, assignments: list[ContainerDevices] | list[Pod]
          ) -> Iterator[Kubelet]:
    """Serve PodResources v1 `List` on <socket_dir>/kubelet.sock until the block ends."""
    from concurrent import futures

    socket = socket_dir / podresources.SOCKET_NAME
    kubelet = Kubelet(socket=socket, pods=_as_pods(assignments))
    handler = grpc.method_handlers_generic_handler(podresources.SERVICE, {
        "List": grpc.unary_unary_rpc_method_handler(kubelet._list)})  # bytes in and out
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(f"unix:{socket}") == 0:
        raise RuntimeError(f"cannot listen on {socket}")
    server.start()
    try:
        yield kubelet
    finally:
        kubelet._released.set()
        server.stop(grace=None).wait(10)
        socket.unlink(missing_ok=True)
