"""signal, wait-ready and status: readiness only after verification, Kubernetes calls to a
real HTTP server on 127.0.0.1, and what an operator reads."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from native.contexts import make_ctx, node_args

from installer.cli import cli
from installer.packages.manifest import Package
from installer.pipeline import runner
from installer.stages import signal, stage
from installer.testing import SAMPLE_NODES, build_node

VERSION = "535.261.03"
INSTALL = "home/kubernetes/bin/nvidia"
TOKEN = "test-token-5f1c"
NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Thu Jun 26 2025\n"


@dataclass
class ApiRecorder:
    """What the fake API server received, and how it should answer."""

    requests: list[dict[str, object]] = field(default_factory=list)
    status: int = 200
    node: dict[str, object] = field(default_factory=lambda: {"kind": "Node", "metadata": {}})


def _handler(recorder: ApiRecorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            recorder.requests.append({
                "method": self.command, "path": self.path, "body": json.loads(body or b"{}"),
                "authorization": self.headers.get("Authorization"),
                "content_type": self.headers.get("Content-Type")})
            reply = recorder.node if self.command == "GET" else {"kind": "Status"}
            answer = json.dumps(reply).encode()
            self.send_response(recorder.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_PATCH = do_POST = _record

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def api() -> Iterator[tuple[str, ApiRecorder]]:
    recorder = ApiRecorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    server.shutdown()
    server.server_close()


@pytest.fixture
def node(tmp_path: Path, standin_package: Package, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A one-GPU node with the stand-in driver staged and its kernel module "loaded"."""
    for name in ("FAKE_NVML_INIT_ERROR", "FAKE_NVML_DRIVER", "FAKE_CUDA_INIT_ERROR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_NVML_GPUS", "1")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    monkeypatch.setenv("FAKE_NVML_BUS_IDS", "00000000:00:05.0")
    for name in ("NODE_NAME", "KUBE_API_URL", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    root = build_node(tmp_path / "node", SAMPLE_NODES["debian12-l4"])
    stage.stage_package(make_ctx(root), standin_package)
    nvrm = root / "proc/driver/nvidia/version"
    nvrm.parent.mkdir(parents=True)
    nvrm.write_text(NVRM.format(VERSION))
    return root


def service_account(tmp_path: Path) -> Path:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    return account


def invoke(root: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, *node_args(root), "--log-format", "json",
                                    "--termination-log", str(root / "termination-log")])


def ready_files(root: Path) -> tuple[Path, Path]:
    return root / INSTALL / ".ready.json", root / "run/nvidia/validations/driver-ready"


class TestReadiness:
    def test_signal_stage_refuses_without_a_passed_verification(self, node: Path) -> None:
        ctx = make_ctx(node)
        with pytest.raises(signal.NotVerifiedError) as raised:
            signal.run(ctx)
        assert raised.value.code == 12
        assert not any(p.exists() for p in ready_files(node))

    def test_signal_command_verifies_then_writes_both_files(self, node: Path) -> None:
        done = invoke(node, "signal", "--output", "json")
        assert done.exit_code == 0, done.output
        ready, env_file = ready_files(node)
        document = json.loads(ready.read_text())
        assert document["driver_version"] == VERSION
        assert document["cuda_version"] == "12.2"
        assert document["flavour"] == "proprietary"
        assert document["gpus"][0]["pci_bus_id"] == "00000000:00:05.0"
        assert document["gpus"][0]["uuid"].startswith("GPU-")
        assert set(document["timings_ms"]) == {"detect", "verify"}
        assert env_file.read_text() == (
            "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/home/kubernetes/bin/nvidia\n"
            "DRIVER_ROOT_CTR_PATH=/host/home/kubernetes/bin/nvidia\nNVIDIA_DEV_ROOT=/\n"
            "DEV_ROOT_CTR_PATH=/host\n")
        assert sorted(p.name for p in env_file.parent.iterdir()) == ["driver-ready"]

    def test_failed_verification_leaves_no_readiness(self, node: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        assert invoke(node, "signal").exit_code == 0
        monkeypatch.setenv("FAKE_NVML_INIT_ERROR", "9")
        done = invoke(node, "signal")
        assert done.exit_code == 12
        assert "kernel module not loaded" in done.stderr
        assert not any(p.exists() for p in ready_files(node))

    def test_staging_withdraws_readiness_first(self, node: Path,
                                               standin_package: Package) -> None:
        assert invoke(node, "signal").exit_code == 0
        ctx = make_ctx(node)
        ctx.package = standin_package
        stage.run(ctx)
        assert not any(p.exists() for p in ready_files(node))


class TestKubernetes:
    def test_labels_and_event_sent_with_the_token(self, node: Path, tmp_path: Path,
                                                  api: tuple[str, ApiRecorder]) -> None:
        url, recorder = api
        done = invoke(node, "signal", "--node-name", "gpu-node-1", "--kube-api", url,
                      "--service-account-dir", str(service_account(tmp_path)))
        assert done.exit_code == 0, done.output
        get, patch, event = recorder.requests
        assert get["method"] == "GET" and get["path"] == "/api/v1/nodes/gpu-node-1"
        assert patch["method"] == "PATCH" and patch["path"] == "/api/v1/nodes/gpu-node-1"
        assert patch["content_type"] == "application/merge-patch+json"
        assert patch["authorization"] == f"Bearer {TOKEN}"
        body = patch["body"]
        assert isinstance(body, dict)
        assert body["metadata"]["labels"]["gpu-node-installer/driver-version"] == VERSION
        assert body["metadata"]["labels"]["gpu-node-installer/cuda-version"] == "12.2"
        assert body["metadata"]["labels"]["gpu-node-installer/status"] == "ready"
        assert event["method"] == "POST"
        assert event["path"] == "/api/v1/namespaces/default/events"
        assert event["authorization"] == f"Bearer {TOKEN}"
        body = event["body"]
        assert isinstance(body, dict)
        assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node",
                                          "name": "gpu-node-1", "uid": "gpu-node-1"}
        assert (body["reason"], body["type"]) == ("DriverReady", "Normal")
        assert f"NVIDIA driver {VERSION} ready on 1 GPU(s)" in body["message"]

    def test_api_down_is_only_a_warning(self, node: Path, tmp_path: Path) -> None:
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        done = invoke(node, "signal", "--node-name", "gpu-node-1",
                      "--kube-api", f"http://127.0.0.1:{port}",
                      "--service-account-dir", str(service_account(tmp_path)))
        assert done.exit_code == 0, done.output
        assert "Warning: could not label the node: PATCH /api/v1/nodes/gpu-node-1: " \
               "ConnectionError" in done.stdout
        assert '"severity": "WARNING"' in done.stderr
        assert all(p.exists() for p in ready_files(node))

    def test_api_refusal_is_only_a_warning(self, node: Path, tmp_path: Path,
                                           api: tuple[str, ApiRecorder]) -> None:
        url, recorder = api
        recorder.status = 403
        done = invoke(node, "signal", "--node-name", "gpu-node-1", "--kube-api", url,
                      "--service-account-dir", str(service_account(tmp_path)))
        assert done.exit_code == 0, done.output
        assert "HTTP 403" in done.stdout
        assert "could not read the node's labels (stale ones stay)" in done.stdout
        assert [r["method"] for r in recorder.requests] == ["GET", "PATCH", "POST"]

    def test_no_token_means_no_call(self, node: Path, tmp_path: Path,
                                    api: tuple[str, ApiRecorder]) -> None:
        url, recorder = api
        done = invoke(node, "signal", "--node-name", "gpu-node-1", "--kube-api", url,
                      "--service-account-dir", str(tmp_path / "none"))
        assert done.exit_code == 0, done.output
        assert "no API server URL or service-account token" in done.stdout
        assert recorder.requests == []


class TestWaitReady:
    def test_times_out_with_the_reason(self, node: Path) -> None:
        done = invoke(node, "wait-ready", "--timeout", "0.2", "--interval", "0.05")
        assert done.exit_code == 12
        assert done.stderr.startswith("error(wait-timeout): node not ready after 0.2s: no "
                                      ".ready.json in /home/kubernetes/bin/nvidia")

    def test_a_timeout_as_json_for_scripts(self, node: Path) -> None:
        done = invoke(node, "wait-ready", "--timeout", "0", "-o", "json")
        assert done.exit_code == 12
        failure = json.loads(done.stdout)
        assert failure["exit_code"] == 12 and failure["slug"] == "wait-timeout"
        assert failure["message"].startswith("node not ready after 0s: no .ready.json")
        assert failure["fix"] == "look at the installer pod's log on this node"
        assert failure["error"] == done.stderr.strip()

    def test_returns_once_readiness_appears(self, node: Path) -> None:
        ctx = make_ctx(node)  # not CliRunner: it swaps sys.stdout for the whole process
        def verify_then_signal() -> None:
            runner.detect(ctx)
            runner.verify(ctx)
            runner.signal(ctx)

        writer = threading.Timer(0.3, verify_then_signal)
        writer.start()
        done = invoke(node, "wait-ready", "--timeout", "60", "--interval", "0.05")
        writer.join()
        assert done.exit_code == 0, done.output
        assert done.stdout.startswith(f"ready: driver {VERSION} verified on 1 GPU(s)")

    def test_readiness_for_another_loaded_driver_is_not_ready(self, node: Path) -> None:
        assert invoke(node, "signal").exit_code == 0
        (node / "proc/driver/nvidia/version").write_text(NVRM.format("535.309.01"))
        done = invoke(node, "wait-ready", "--timeout", "0.1", "--interval", "0.05")
        assert done.exit_code == 12
        assert f"readiness is for driver {VERSION} but the kernel has 535.309.01" in done.stderr


class TestStatus:
    def test_text_and_json_report(self, node: Path) -> None:
        assert invoke(node, "signal").exit_code == 0
        state = {"driver_version": VERSION, "timings_ms": {"fetch": 12.5, "stage": 40.0}}
        (node / INSTALL / ".state.json").write_text(json.dumps(state))
        text = invoke(node, "status")
        assert text.exit_code == 0, text.output
        assert f"Staged:          {VERSION}-6.1.0-26-cloud-amd64-proprietary" in text.stdout
        assert "Ready:           yes" in text.stdout
        assert "Last run:        fetch 12 ms, stage 40 ms" in text.stdout
        report = json.loads(invoke(node, "status", "--output", "json").stdout)
        assert report["staged"]["meta"]["driver_version"] == VERSION
        assert report["readiness"]["ready"] is True
        assert report["readiness"]["env_file"] is True
        assert report["node"]["kernel"]["release"] == "6.1.0-26-cloud-amd64"
        assert report["cache"]["packages"] == []

    def test_empty_node(self, tmp_path: Path) -> None:
        root = build_node(tmp_path / "empty", SAMPLE_NODES["debian12-no-gpu"])
        done = invoke(root, "status")
        assert done.exit_code == 0, done.output
        assert "Staged:          nothing" in done.stdout
        assert "Ready:           no" in done.stdout
