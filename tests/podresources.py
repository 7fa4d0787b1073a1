"""A kubelet stand-in for the PodResources API: a real gRPC server on a unix socket.

`serve(socket_dir, assignments)` listens on `<socket_dir>/kubelet.sock` and answers
`v1.PodResourcesLister/List` with the given assignments, encoded with the same v1 field
numbers the kubelet uses (the message classes come from the client's descriptor, so a wrong
number there would fail against a real kubelet but not here: tests/unit/test_podresources.py
also checks the bytes against hand-encoded protobuf). The yielded `Kubelet` can change its
answer, fail with a gRPC status, or stall, while the server runs.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from installer.node import podresources
from installer.node.podresources import ContainerDevices


@dataclass
class Kubelet:
    """What the stand-in answers; tests may change these while it serves."""

    socket: Path
    assignments: list[ContainerDevices]
    fail: grpc.StatusCode | None = None  # answer every List with this status
    stall: bool = False  # hold every List until the server stops (a hung kubelet)
    calls: int = 0
    _released: threading.Event = field(default_factory=threading.Event)

    def response(self) -> Any:
        """The v1 ListPodResourcesResponse for the current assignments, pods in first-seen
        order, a pod's containers likewise."""
        classes = podresources.message_classes()
        pods: dict[tuple[str, str], dict[str, list[ContainerDevices]]] = {}
        for entry in self.assignments:
            containers = pods.setdefault((entry.namespace, entry.pod), {})
            containers.setdefault(entry.container, []).append(entry)
        answer = classes["ListPodResourcesResponse"]()
        for (namespace, name), containers in pods.items():
            pod = answer.pod_resources.add(name=name, namespace=namespace)
            for container_name, entries in containers.items():
                container = pod.containers.add(name=container_name)
                for entry in entries:
                    container.devices.add(resource_name=entry.resource,
                                          device_ids=list(entry.device_ids))
        return answer

    def _list(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        if self.stall:
            self._released.wait(60)
        if self.fail is not None:
            context.abort(self.fail, "stand-in kubelet told to fail")
        return self.response()


def short_dir() -> Path:
    """A temp dir with a short path: a unix socket's path must fit in 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))


@contextmanager
def serve(socket_dir: Path, assignments: list[ContainerDevices]) -> Iterator[Kubelet]:
    """Serve PodResources v1 `List` on <socket_dir>/kubelet.sock until the block ends."""
    from concurrent import futures

    socket = socket_dir / podresources.SOCKET_NAME
    kubelet = Kubelet(socket=socket, assignments=list(assignments))
    classes = podresources.message_classes()
    handler = grpc.method_handlers_generic_handler(podresources.SERVICE, {
        "List": grpc.unary_unary_rpc_method_handler(
            kubelet._list, request_deserializer=classes["ListPodResourcesRequest"].FromString,
            response_serializer=lambda message: message.SerializeToString())})
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
