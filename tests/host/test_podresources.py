"""The kubelet PodResources client against a real gRPC server on a unix socket.

tests/podresources.py is the kubelet stand-in (grpcio, v1 proto). Each failure the agent can
meet on a node is one test: no socket, a stale socket file, a server error, a socket that
is no gRPC server, a kubelet that never answers. Every failure is one PodResourcesUnavailable
line naming the socket.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from podresources import serve, short_dir

from installer.node.podresources import (
    ContainerDevices,
    PodResourcesUnavailable,
    list_assignments,
    message_classes,
)

GPU = "nvidia.com/gpu"
TRAIN = ContainerDevices("ml", "train-0", "trainer", GPU, ("nvidia0", "nvidia3"))
SIDECAR_NIC = ContainerDevices("ml", "train-0", "trainer", "example.com/nic", ("nic1",))
INFER = ContainerDevices("serve", "infer-7f9c", "server",
                         GPU, ("GPU-8c6a1f2e-0d4b-4f7e-9a51-3b2c1d0e9f11",))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _one_line(exc: pytest.ExceptionInfo[PodResourcesUnavailable], socket_path: Path) -> str:
    text = str(exc.value)
    assert "\n" not in text
    assert str(socket_path) in text
    return text


def test_assignments_listed_per_container_and_resource(socket_dir: Path) -> None:
    empty_pod = ContainerDevices("kube-system", "dns", "coredns", GPU, ())
    with serve(socket_dir, [TRAIN, SIDECAR_NIC, INFER, empty_pod]) as kubelet:
        found = list_assignments(socket_dir)
        assert kubelet.calls == 1
    # a container holding no device of a resource is left out, as it holds no GPU
    assert found == [TRAIN, SIDECAR_NIC, INFER]


def test_answer_follows_the_kubelet(socket_dir: Path) -> None:
    with serve(socket_dir, [TRAIN]) as kubelet:
        assert list_assignments(socket_dir) == [TRAIN]
        kubelet.assignments = []
        assert list_assignments(socket_dir) == []
        kubelet.assignments = [INFER]
        assert list_assignments(socket_dir) == [INFER]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), lengths below 128."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_field_numbers_are_the_kubelets_v1() -> None:
    """Bytes laid out by hand from kubelet's api.proto (pod_resources=1; name=1, namespace=2,
    containers=3; name=1, devices=2; resource_name=1, device_ids=2) decode as expected, and
    unknown later fields (topology=3 in ContainerDevices) are skipped."""
    devices = (_field(1, b"nvidia.com/gpu") + _field(2, b"nvidia1") + _field(2, b"nvidia2")
               + _field(3, _field(1, b"")))
    container = _field(1, b"main") + _field(2, devices)
    pod = _field(1, b"job-a") + _field(2, b"team") + _field(3, container)
    wire = _field(1, pod)
    response = message_classes()["ListPodResourcesResponse"].FromString(wire)
    (decoded,) = response.pod_resources
    assert (decoded.name, decoded.namespace) == ("job-a", "team")
    (entry,) = decoded.containers
    assert entry.name == "main"
    assert list(entry.devices[0].device_ids) == ["nvidia1", "nvidia2"]
    assert entry.devices[0].resource_name == "nvidia.com/gpu"


def test_no_socket_directory(tmp_path: Path) -> None:
    missing = tmp_path / "pod-resources"
    with pytest.raises(PodResourcesUnavailable) as exc:
        list_assignments(missing)
    text = _one_line(exc, missing / "kubelet.sock")
    assert "does not exist" in text and "POD_RESOURCES_DIR" in text


def test_a_file_that_is_not_a_socket(socket_dir: Path) -> None:
    (socket_dir / "kubelet.sock").write_text("not a socket\n")
    with pytest.raises(PodResourcesUnavailable) as exc:
        list_assignments(socket_dir)
    assert "is not a socket" in _one_line(exc, socket_dir / "kubelet.sock")


def test_socket_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "pod-resources").write_text("")
    with pytest.raises(PodResourcesUnavailable) as exc:
        list_assignments(tmp_path / "pod-resources")
    text = _one_line(exc, tmp_path / "pod-resources" / "kubelet.sock")
    assert "Not a directory" in text and "POD_RESOURCES_DIR" in text


def test_stale_socket_nobody_listens(socket_dir: Path) -> None:
    path = socket_dir / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # the file stays after close: a kubelet that has gone
    with pytest.raises(PodResourcesUnavailable) as exc:
        list_assignments(socket_dir, timeout_s=5)
    assert "UNAVAILABLE" in _one_line(exc, path)


@pytest.mark.parametrize("status", [grpc.StatusCode.INTERNAL, grpc.StatusCode.PERMISSION_DENIED,
                                    grpc.StatusCode.UNIMPLEMENTED])
def test_server_error(socket_dir: Path, status: grpc.StatusCode) -> None:
    with serve(socket_dir, [TRAIN]) as kubelet:
        kubelet.fail = status
        with pytest.raises(PodResourcesUnavailable) as exc:
            list_assignments(socket_dir)
        kubelet.fail = None
        assert list_assignments(socket_dir) == [TRAIN]  # it recovers on the next call
    text = _one_line(exc, socket_dir / "kubelet.sock")
    assert f"{status.name}: stand-in kubelet told to fail" in text


def _garbage_server(path: Path, stop: threading.Event) -> None:
    """Accept connections on a unix socket and answer HTTP/1.1 text: no gRPC there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def test_socket_that_is_not_a_grpc_server(socket_dir: Path) -> None:
    path = socket_dir / "kubelet.sock"
    stop = threading.Event()
    thread = threading.Thread(target=_garbage_server, args=(path, stop), daemon=True)
    thread.start()
    try:
        while not path.exists():
            stop.wait(0.01)
        with pytest.raises(PodResourcesUnavailable) as exc:
            list_assignments(socket_dir, timeout_s=5)
    finally:
        stop.set()
        thread.join(5)
    text = _one_line(exc, path)
    assert "PodResources List failed: UNAVAILABLE" in text


def test_kubelet_that_never_answers_times_out(socket_dir: Path) -> None:
    with serve(socket_dir, [TRAIN]) as kubelet:
        kubelet.stall = True
        with pytest.raises(PodResourcesUnavailable) as exc:
            list_assignments(socket_dir, timeout_s=0.5)
    assert "DEADLINE_EXCEEDED" in _one_line(exc, socket_dir / "kubelet.sock")


def test_grpc_is_imported_only_when_called() -> None:
    """The agent with metrics off never pays for grpc and protobuf (memory budget)."""
    probe = ("import sys, installer.node.podresources as p; "
             "print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
