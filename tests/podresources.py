"""A kubelet stand-in for the PodResources API: a real gRPC server on a unix socket.

`serve(socket_dir, assignments)` listens on `<socket_dir>/kubelet.sock` and answers
`v1.PodResourcesLister/List` with the given assignments, encoded by the protobuf library from
a descriptor of kubelet's v1 messages written here (names and numbers as in kubelet's
api.proto). The client (installer/node/podresources.py) decodes the wire format itself, so
the two implementations check each other. The yielded `Kubelet` can change its answer, send
raw bytes instead, fail with a gRPC status, or stall, while the server runs.
"""

from __future__ import annotations

import functools
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
_STRING, _MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, \
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_ONE, _MANY = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, \
    descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
# message -> [(field, number, type, label, message type)]; ContainerDevices' topology (3) is
# there so that answers carry a field the client does not know, as a current kubelet's do.
V1 = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [("name", 1, _STRING, _ONE, ""), ("namespace", 2, _STRING, _ONE, ""),
                     ("containers", 3, _MESSAGE, _MANY, "ContainerResources")],
    "ContainerResources": [("name", 1, _STRING, _ONE, ""),
                           ("devices", 2, _MESSAGE, _MANY, "ContainerDevices")],
    "ContainerDevices": [("resource_name", 1, _STRING, _ONE, ""),
                         ("device_ids", 2, _STRING, _MANY, ""),
                         ("topology", 3, _MESSAGE, _ONE, "TopologyInfo")],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, descriptor_pb2.FieldDescriptorProto.TYPE_INT64, _ONE, "")],
}


@functools.cache
def messages() -> dict[str, Any]:
    """Message name -> protobuf class, from the descriptor above."""
    proto = descriptor_pb2.FileDescriptorProto(name="tests/podresources_v1.proto",
                                                package=PACKAGE, syntax="proto3")
    for message, fields in V1.items():
        described = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            added = described.field.add(name=name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"{PACKAGE}.{name}")) for name in V1}


def encode(assignments: list[ContainerDevices], numa_node: int | None = 0) -> bytes:
    """A ListPodResourcesResponse: pods in first-seen order, a pod's containers likewise,
    each device entry with a NUMA topology unless `numa_node` is None."""
    pods: dict[tuple[str, str], dict[str, list[ContainerDevices]]] = {}
    for entry in assignments:
        containers = pods.setdefault((entry.namespace, entry.pod), {})
        containers.setdefault(entry.container, []).append(entry)
    answer = messages()["ListPodResourcesResponse"]()
    for (namespace, name), containers in pods.items():
        pod = answer.pod_resources.add(name=name, namespace=namespace)
        for container_name, entries in containers.items():
            container = pod.containers.add(name=container_name)
            for entry in entries:
                devices = container.devices.add(resource_name=entry.resource,
                                                device_ids=list(entry.device_ids))
                if numa_node is not None:
                    devices.topology.nodes.add(ID=numa_node)
    return bytes(answer.SerializeToString())


@dataclass
class Kubelet:
    """What the stand-in answers; tests may change these while it serves."""

    socket: Path
    assignments: list[ContainerDevices]
    fail: grpc.StatusCode | None = None  # answer every List with this status
    stall: bool = False  # hold every List until the server stops (a hung kubelet)
    raw: bytes | None = None  # answer these bytes instead of the assignments
    calls: int = 0
    _released: threading.Event = field(default_factory=threading.Event)

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if request:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "List takes an empty request")
        if self.stall:
            self._released.wait(60)
        if self.fail is not None:
            context.abort(self.fail, "stand-in kubelet told to fail")
        return self.raw if self.raw is not None else encode(self.assignments)


def short_dir() -> Path:
    """A temp dir with a short path: a unix socket's path must fit in 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))


@contextmanager
def serve(socket_dir: Path, assignments: list[ContainerDevices]) -> Iterator[Kubelet]:
    """Serve PodResources v1 `List` on <socket_dir>/kubelet.sock until the block ends."""
    from concurrent import futures

    socket = socket_dir / podresources.SOCKET_NAME
    kubelet = Kubelet(socket=socket, assignments=list(assignments))
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
