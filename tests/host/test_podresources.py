"""The kubelet PodResources client against a real gRPC server on a unix socket.

tests/podresources.py is the kubelet stand-in (grpcio, v1 proto, answering in the kubelet's
shape: one entry per device and NUMA node, every container, CPUs, memory, DRA claims).
Each failure the agent can meet on a node is one test: no socket, a stale socket file, a
server error, a socket that is no gRPC server, a kubelet that never answers. Every failure
is one PodResourcesUnavailable line naming the socket.
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
from hypothesis import given, settings
from hypothesis import strategies as st
from podresources import (
    Claim,
    Container,
    Device,
    DraDevice,
    Memory,
    Pod,
    answer,
    encode,
    pods_of,
    serve,
    short_dir,
)

from installer.node.podresources import (
    Assignment,
    ClaimDevice,
    ContainerDevices,
    PodResourcesUnavailable,
    list_assignments,
    parse_response,
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


def rows(found: list[Assignment] | list[ContainerDevices]
         ) -> set[tuple[str, str, str, str, frozenset[str]]]:
    """Device plugin rows without order: the kubelet's resources and devices come in Go's
    map order."""
    listed = [(r.namespace, r.pod, r.container, r.resource, frozenset(r.device_ids))
              for r in found if isinstance(r, ContainerDevices)]
    assert len(set(listed)) == len(listed)  # one row per (namespace, pod, container, resource)
    assert all(len(set(r.device_ids)) == len(r.device_ids)  # each id once
               for r in found if isinstance(r, ContainerDevices))
    return set(listed)


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
    assert rows(found) == rows([TRAIN, SIDECAR_NIC, INFER])


def test_answer_follows_the_kubelet(socket_dir: Path) -> None:
    with serve(socket_dir, [TRAIN]) as kubelet:
        assert rows(list_assignments(socket_dir)) == rows([TRAIN])
        kubelet.assignments = []
        assert list_assignments(socket_dir) == []
        kubelet.assignments = [INFER]
        assert list_assignments(socket_dir) == [INFER]


def test_a_large_answer_crosses_http2_flow_control_windows(socket_dir: Path) -> None:
    """Far over HTTP/2's initial 64 KiB window: the client must grant more as it reads."""
    many = [ContainerDevices(f"ns-{i % 7}", f"pod-{i}", "main", GPU,
                             tuple(f"GPU-{i:08d}-{j}-{'x' * 40}" for j in range(8)))
            for i in range(1000)]
    with serve(socket_dir, many):
        assert rows(list_assignments(socket_dir, timeout_s=30)) == rows(many)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), lengths below 128."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_two_gpus_are_one_row_of_two(socket_dir: Path) -> None:
    """The kubelet's answer for a pod as a cluster has it, read back with protobuf: one
    `ContainerDevices` per device and NUMA node, the GPU-less container listed, the sidecar
    first, the plain init container not at all; the client's view: one row per container
    and resource, each GPU once."""
    trainer = Container("trainer", {GPU: (Device("GPU-a", (0,)), Device("GPU-b", (0, 1))),
                                    "example.com/nic": (Device("nic1", None),)},
                        cpu_ids=(4, 5), memory=(Memory("memory", 2**30, (0, 1)),))
    pod = Pod("ml", "train-0", (
        Container("setup", {GPU: (Device("GPU-z"),)}, init="init"), trainer,
        Container("logger"), Container("proxy", {GPU: (Device("GPU-c"),)}, init="sidecar"),
        Container("dra", claims=(Claim("gpu-claim", "ml", (
            DraDevice("gpu.nvidia.com", "node-1", "gpu-3", ("k8s.gpu.nvidia.com/claim=a",)),
            DraDevice("gpu.nvidia.com", "node-1", "gpu-4", ("k8s.gpu.nvidia.com/claim=b",),
                      share_id="7c1d"))),))),
        cpu_ids=(4, 5, 6))
    message = answer([pod])
    [listed] = message.pod_resources
    assert [c.name for c in listed.containers] == ["proxy", "trainer", "logger", "dra"]
    assert list(listed.cpu_ids) == [4, 5, 6]
    devices = [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
               for d in listed.containers[1].devices]
    assert devices == [(GPU, ["GPU-a"], [0]), (GPU, ["GPU-b"], [0]), (GPU, ["GPU-b"], [1]),
                       ("example.com/nic", ["nic1"], [])]
    assert not listed.containers[1].devices[3].HasField("topology")
    assert list(listed.containers[1].cpu_ids) == [4, 5]
    assert listed.containers[1].memory[0].size == 2**30
    assert not listed.containers[2].devices  # logger: listed, holding nothing
    [claim] = listed.containers[3].dynamic_resources
    first, second = claim.claim_resources
    assert (claim.claim_name, first.device_name, second.device_name) == (
        "gpu-claim", "gpu-3", "gpu-4")
    assert not first.HasField("share_id") and second.share_id == "7c1d"
    # one CDI slice per driver in the kubelet's loop: the second device repeats the first's
    assert [c.name for c in second.cdi_devices] == ["k8s.gpu.nvidia.com/claim=a",
                                                     "k8s.gpu.nvidia.com/claim=b"]
    with serve(socket_dir, [pod]) as kubelet:
        for _ in range(5):  # Go's map order changes between answers; the rows do not
            found = list_assignments(socket_dir)
            assert rows(found) == {
                ("ml", "train-0", "proxy", GPU, frozenset({"GPU-c"})),
                ("ml", "train-0", "trainer", GPU, frozenset({"GPU-a", "GPU-b"})),
                ("ml", "train-0", "trainer", "example.com/nic", frozenset({"nic1"}))}
            assert [r for r in found if isinstance(r, ClaimDevice)] == [
                ClaimDevice("ml", "train-0", "dra", "ml/gpu-claim", "gpu.nvidia.com", "node-1",
                            "gpu-3"),
                ClaimDevice("ml", "train-0", "dra", "ml/gpu-claim", "gpu.nvidia.com", "node-1",
                            "gpu-4", share_id="7c1d")]
        assert kubelet.calls == 5


def test_field_numbers_are_the_kubelets_v1() -> None:
    """Bytes laid out by hand from kubelet's api.proto (pod_resources=1; name=1, namespace=2,
    containers=3; name=1, devices=2; resource_name=1, device_ids=2) decode as expected; fields
    of every wire type the client does not know are skipped (topology=3, a varint 9, a
    fixed64 10, a fixed32 11, a packed cpu_ids=3 in the container)."""
    unknown = (_field(3, _field(1, b"\x08\x01")) + bytes([9 << 3, 0x96, 0x01])
               + bytes([10 << 3 | 1]) + bytes(8) + bytes([11 << 3 | 5]) + bytes(4))
    devices = (_field(1, b"nvidia.com/gpu") + _field(2, b"nvidia1") + unknown
               + _field(2, b"nvidia2"))
    again = _field(1, b"nvidia.com/gpu") + _field(2, b"nvidia3") + _field(2, b"nvidia1")
    container = (_field(1, b"main") + _field(2, devices) + _field(3, b"\x02\x03")
                 + _field(2, again))
    pod = _field(1, b"job-a") + _field(2, b"team") + _field(3, container)
    assert parse_response(_field(1, pod)) == [
        ContainerDevices("team", "job-a", "main", "nvidia.com/gpu",
                         ("nvidia1", "nvidia2", "nvidia3"))]
    assert parse_response(b"") == []


NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
ENTRIES = st.lists(st.builds(ContainerDevices, NAMES, NAMES, NAMES, NAMES,
                             st.lists(NAMES, max_size=4).map(tuple)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(ENTRIES, st.one_of(st.none(), st.integers(0, 2**62)))
def test_what_protobuf_encodes_the_client_decodes(entries: list[ContainerDevices],
                                                  numa: int | None) -> None:
    """The stand-in's encoder is the protobuf library; the client's decoder is its own. The
    answer has one entry per device; the client gives one row per (namespace, pod,
    container, resource) with each of its devices once, in the kubelet's order."""
    decoded = parse_response(encode(entries, numa_node=numa))
    expected = [(p.namespace, p.name, c.name, resource, tuple(d.id for d in devices))
                for p in pods_of(entries) for c in p.containers
                for resource, devices in c.devices.items()]
    merged: dict[tuple[str, str, str, str], dict[str, None]] = {}
    for *key, ids in expected:
        merged.setdefault(tuple(key), {}).update(dict.fromkeys(ids))  # type: ignore[arg-type]
    assert decoded == [ContainerDevices(*key, tuple(ids)) for key, ids in merged.items()]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_value_error(data: bytes) -> None:
    """Whatever a broken or hostile socket sends: entries with devices, or ValueError
    (which list_assignments turns into one line), never another exception."""
    try:
        found = parse_response(data)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert all(isinstance(entry, ClaimDevice) or entry.device_ids for entry in found)


@pytest.mark.parametrize(("answer", "why"), [
    (b"\x0a\x05abc", "runs past the end"),
    (b"\x0a\x03\x0a\x01\xff", "not UTF-8"),
    (b"\x08\x01", "wire type 0"),
    (b"\x0b", "wire type 3"),
])
def test_an_answer_that_is_not_v1_is_one_line(socket_dir: Path, answer: bytes,
                                              why: str) -> None:
    with serve(socket_dir, [TRAIN]) as kubelet:
        kubelet.raw = answer
        with pytest.raises(PodResourcesUnavailable) as exc:
            list_assignments(socket_dir)
    text = _one_line(exc, socket_dir / "kubelet.sock")
    assert "not a v1 ListPodResourcesResponse" in text and why in text


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
        assert rows(list_assignments(socket_dir)) == rows([TRAIN])  # it recovers
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


def test_h2_is_imported_only_when_called_and_grpc_protobuf_never(socket_dir: Path) -> None:
    """The agent with metrics off never pays for the HTTP/2 client; with them on, never for
    grpcio or protobuf's runtime (memory budget): a real call in a fresh interpreter."""
    probe = ("import sys, pathlib, installer.node.podresources as p; loaded = lambda: sorted("
             "m for m in ('h2', 'grpc', 'google.protobuf') if m in sys.modules); print(loaded());"
             f" print(p.list_assignments(pathlib.Path({str(socket_dir)!r}))); print(loaded())")
    with serve(socket_dir, [INFER]):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, timeout=60).stdout.splitlines()
    assert out == ["[]", repr([INFER]), "['h2']"]
