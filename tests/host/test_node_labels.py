"""GPU labels on the Node: what `signal` (and `install`) patch, on the NVML stand-in with 1 and
8 GPUs and a mixed node, checked against the Node schema; stale labels of ours removed,
others' kept; `check-pod --here` reads the same labels back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from click.testing import CliRunner, Result
from e2e import add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer
from native.contexts import make_ctx, node_args

from installer.cli import cli
from installer.compat.nodelabels import OWNED_ANNOTATION, valid_key, valid_value
from installer.packages.manifest import Package
from installer.stages import stage
from installer.testing import NodeSpec, PciSpec, build_node

VERSION = "535.261.03"
NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Thu Jun 26 2025\n"
P = "gpu-node-installer/"


class FakeApi:
    """A Node on a fake API server: GET answers it, PATCH is recorded (and merged)."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = {"kind": "Node", "metadata": {"name": "gpu-1"}}
        self.patches: list[dict[str, Any]] = []

    def merged_labels(self) -> dict[str, str]:
        labels = dict(self.node["metadata"].get("labels", {}))
        for patch in self.patches:
            for key, value in patch["metadata"]["labels"].items():
                if value is None:
                    labels.pop(key, None)
                else:
                    labels[key] = value
        return labels


@pytest.fixture
def api() -> Iterator[tuple[str, FakeApi]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer(fake.node)

        def do_PATCH(self) -> None:
            fake.patches.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._answer(fake.node)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer({})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()
    server.server_close()


def _node(root: Path, package: Package, gpus: list[tuple[str, int]]) -> Path:
    """A Debian node with these (PCI address, device id) GPUs, the driver staged."""
    spec = NodeSpec(os="debian-12", kernel="6.1.0-26-cloud-amd64",
                    pci=tuple(PciSpec(a, d, 0x030200, driver=None) for a, d in gpus))
    build_node(root, spec)
    stage.stage_package(make_ctx(root), package)
    nvrm = root / "proc/driver/nvidia/version"
    nvrm.parent.mkdir(parents=True)
    nvrm.write_text(NVRM.format(VERSION))
    return root


def _nvml(monkeypatch: pytest.MonkeyPatch, names: list[str], memory: list[int],
          compute: list[str]) -> None:
    count = str(len(names))
    for name, value in (("FAKE_NVML_GPUS", count), ("FAKE_CUDA_DEVICES", count),
                        ("FAKE_NVML_NAMES", ",".join(names)),
                        ("FAKE_NVML_MEMORY_MIB", ",".join(map(str, memory))),
                        ("FAKE_NVML_COMPUTE", ",".join(compute)),
                        ("FAKE_NVML_BUS_IDS", ",".join(f"00000000:{10 + i:02x}:00.0"
                                                       for i in range(len(names))))):
        monkeypatch.setenv(name, value)
    for name in ("FAKE_NVML_INIT_ERROR", "FAKE_NVML_DRIVER", "FAKE_CUDA_INIT_ERROR",
                 "NODE_NAME", "KUBE_API_URL", "KUBERNETES_SERVICE_HOST", "GPU_LABEL_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def _addresses(count: int) -> list[str]:
    return [f"0000:{10 + i:02x}:00.0" for i in range(count)]


def _signal(root: Path, url: str, tmp_path: Path, *extra: str) -> Result:
    account = tmp_path / "sa"
    account.mkdir(exist_ok=True)
    (account / "token").write_text("tok\n")
    return CliRunner().invoke(cli, ["signal", *node_args(root), "--log-format", "json",
                                    "--termination-log", str(tmp_path / "tl"),
                                    "--node-name", "gpu-1", "--kube-api", url,
                                    "--service-account-dir", str(account), *extra])


def _valid_patch(patch: dict[str, Any]) -> None:
    """The patch applied to a Node is a valid Node (strict schema) with valid label syntax."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", **patch["metadata"]}}
    for version in ("1.28.0", "1.33.0"):
        kubernetes_validate.validate(node, version, strict=True)
    for key, value in patch["metadata"]["labels"].items():
        assert valid_key(key), key
        assert value is None or valid_value(value), (key, value)


def _signalled(root: Path, api: tuple[str, FakeApi], tmp_path: Path,
               *extra: str) -> dict[str, Any]:
    """`signal` succeeds and sends the Node exactly one patch, a valid one; returns it."""
    url, fake = api
    done = _signal(root, url, tmp_path, *extra)
    assert done.exit_code == 0, done.output
    (patch,) = fake.patches
    _valid_patch(patch)
    return patch


class TestGpuLabels:
    def test_one_gpu(self, tmp_path: Path, standin_package: Package,
                     monkeypatch: pytest.MonkeyPatch, api: tuple[str, FakeApi]) -> None:
        _nvml(monkeypatch, ["NVIDIA L4"], [23034], ["8.9"])
        root = _node(tmp_path / "n", standin_package, [(_addresses(1)[0], 0x27B8)])
        labels = _signalled(root, api, tmp_path)["metadata"]["labels"]
        assert {k: v for k, v in labels.items() if k.startswith(P)} == {
            P + "driver-version": VERSION, P + "cuda-version": "12.2", P + "status": "ready",
            P + "gpu.product": "NVIDIA-L4", P + "gpu.count": "1", P + "gpu.memory": "23034",
            P + "gpu.family": "ada-lovelace", P + "gpu.compute.major": "8",
            P + "gpu.compute.minor": "9", P + "cuda.driver.major": "535",
            P + "cuda.driver.minor": "261", P + "cuda.driver.rev": "03",
            P + "cuda.runtime.major": "12", P + "cuda.runtime.minor": "2",
            P + "cuda.toolkit.max": "12.2", P + "cuda.compat.major": "12",
            P + "driver.flavour": "proprietary", P + "gpu.model.NVIDIA-L4": "1"}
        ready = json.loads((root / "home/kubernetes/bin/nvidia/.ready.json").read_text())
        assert ready["labels"][P + "gpu.product"] == "NVIDIA-L4"

    def test_eight_gpus(self, tmp_path: Path, standin_package: Package,
                        monkeypatch: pytest.MonkeyPatch, api: tuple[str, FakeApi]) -> None:
        _nvml(monkeypatch, ["NVIDIA A100-SXM4-40GB"] * 8, [40960] * 8, ["8.0"] * 8)
        root = _node(tmp_path / "n", standin_package,
                     [(a, 0x20B0) for a in _addresses(8)])
        labels = _signalled(root, api, tmp_path)["metadata"]["labels"]
        assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB"
        assert labels[P + "gpu.count"] == "8"
        assert labels[P + "gpu.memory"] == "40960"
        assert labels[P + "gpu.family"] == "ampere"
        assert labels[P + "gpu.model.NVIDIA-A100-SXM4-40GB"] == "8"

    def test_mixed_node(self, tmp_path: Path, standin_package: Package,
                        monkeypatch: pytest.MonkeyPatch, api: tuple[str, FakeApi]) -> None:
        """Two models: product `mixed`, the least memory and capability, a count per model."""
        _nvml(monkeypatch, ["NVIDIA H100 80GB HBM3", "Tesla T4", "Tesla T4"],
              [81559, 15360, 15360], ["9.0", "7.5", "7.5"])
        root = _node(tmp_path / "n", standin_package,
                     list(zip(_addresses(3), (0x2330, 0x1EB8, 0x1EB8), strict=True)))
        labels = _signalled(root, api, tmp_path)["metadata"]["labels"]
        assert labels[P + "gpu.product"] == "mixed"
        assert labels[P + "gpu.family"] == "mixed"
        assert labels[P + "gpu.count"] == "3"
        assert labels[P + "gpu.memory"] == "15360"
        assert (labels[P + "gpu.compute.major"], labels[P + "gpu.compute.minor"]) == ("7", "5")
        assert labels[P + "gpu.model.NVIDIA-H100-80GB-HBM3"] == "1"
        assert labels[P + "gpu.model.Tesla-T4"] == "2"

    def test_nvidia_prefix_setting(self, tmp_path: Path, standin_package: Package,
                                   monkeypatch: pytest.MonkeyPatch,
                                   api: tuple[str, FakeApi]) -> None:
        _nvml(monkeypatch, ["Tesla T4"], [15360], ["7.5"])
        root = _node(tmp_path / "n", standin_package, [(_addresses(1)[0], 0x1EB8)])
        patch = _signalled(root, api, tmp_path, "--gpu-label-prefix", "nvidia.com")
        labels = patch["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
        assert labels["nvidia.com/gpu.family"] == "turing"
        assert labels["nvidia.com/cuda.driver.major"] == "535"
        assert P + "gpu.product" not in labels
        assert labels[P + "driver.flavour"] == "proprietary"  # our own keys stay ours
        owned = patch["metadata"]["annotations"][OWNED_ANNOTATION].split(",")
        assert "nvidia.com/gpu.product" in owned and not any(k.startswith(P) for k in owned)


class TestStaleLabels:
    def test_ours_removed_others_kept(self, tmp_path: Path, standin_package: Package,
                                      monkeypatch: pytest.MonkeyPatch,
                                      api: tuple[str, FakeApi]) -> None:
        """An earlier driver on other GPUs (nvidia.com prefix then): its stale keys go,
        keys we never wrote (gpu-feature-discovery's, the cloud's) stay."""
        _nvml(monkeypatch, ["NVIDIA L4"], [23034], ["8.9"])
        root = _node(tmp_path / "n", standin_package, [(_addresses(1)[0], 0x27B8)])
        _url, fake = api
        fake.node["metadata"]["labels"] = {
            P + "gpu.model.Tesla-T4": "2", P + "cuda.toolkit.max": "11.4",
            P + "gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360",
            "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.machine": "n1-standard-8",
            "cloud.google.com/gke-accelerator": "nvidia-l4", "kubernetes.io/hostname": "gpu-1"}
        fake.node["metadata"]["annotations"] = {OWNED_ANNOTATION: "nvidia.com/gpu.memory"}
        patch = _signalled(root, api, tmp_path)
        removed = {k for k, v in patch["metadata"]["labels"].items() if v is None}
        assert removed == {P + "gpu.model.Tesla-T4", "nvidia.com/gpu.memory"}
        after = fake.merged_labels()
        assert after[P + "gpu.product"] == "NVIDIA-L4"
        assert after[P + "cuda.toolkit.max"] == "12.2"
        assert after["nvidia.com/gpu.product"] == "Tesla-T4"  # not ours: untouched
        assert after["nvidia.com/gpu.machine"] == "n1-standard-8"
        assert after["cloud.google.com/gke-accelerator"] == "nvidia-l4"


class TestCheckPodHere:
    def test_reads_the_labels_signal_wrote(self, tmp_path: Path, standin_package: Package,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        _nvml(monkeypatch, ["NVIDIA L4"], [23034], ["8.9"])
        root = _node(tmp_path / "n", standin_package, [(_addresses(1)[0], 0x27B8)])
        flags = [*node_args(root), "--termination-log", str(tmp_path / "tl")]
        assert CliRunner().invoke(cli, ["signal", *flags]).exit_code == 0
        pod = tmp_path / "pod.yaml"
        pod.write_text(_pod("NVIDIA-L4", "12.2"))
        done = CliRunner().invoke(cli, ["check-pod", str(pod), "--here", *flags,
                                        "--output", "json"])
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        assert report["node"] == {"labels_from": "/home/kubernetes/bin/nvidia/.ready.json",
                                  "driver": VERSION}
        pod.write_text(_pod("NVIDIA-L4", "12.4.1"))
        done = CliRunner().invoke(cli, ["check-pod", str(pod), "--here", *flags])
        assert done.exit_code == 0, done.output  # 12.4 runs on 535 (minor version compat)
        pod.write_text(_pod("NVIDIA-A100-SXM4-40GB", "13.0"))
        done = CliRunner().invoke(cli, ["check-pod", str(pod), "--here", *flags])
        assert done.exit_code == 14
        assert "FAIL  node-selector  nodeSelector gpu-node-installer/gpu.product=NVIDIA-A100-" \
               "SXM4-40GB, but this node has gpu-node-installer/gpu.product=NVIDIA-L4" \
               in done.stdout
        assert "FAIL  cuda" in done.stdout

    def test_before_an_install_labels_come_from_pci_ids(self, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """No readiness yet: detect's GPUs (an L4 by PCI id) and the loaded driver."""
        monkeypatch.delenv("GPU_LABEL_PREFIX", raising=False)
        root = tmp_path / "n"
        build_node(root, NodeSpec(os="debian-12", kernel="6.1.0-26-cloud-amd64",
                                  pci=(PciSpec("0000:00:05.0", 0x27B8, 0x030200),)))
        nvrm = root / "proc/driver/nvidia/version"
        nvrm.parent.mkdir(parents=True)
        nvrm.write_text(NVRM.format("470.256.02"))
        document = json.loads(_pod("L4", "12.2"))
        document["spec"]["nodeSelector"] = {P + "gpu.family": "ada-lovelace"}
        pod = tmp_path / "pod.json"
        pod.write_text(json.dumps(document))
        done = CliRunner().invoke(cli, ["check-pod", str(pod), "--here", *node_args(root),
                                        "--termination-log", str(tmp_path / "tl"),
                                        "--output", "json"])
        assert done.exit_code == 14, done.output  # CUDA 12.2 needs more than 470
        report = json.loads(done.stdout)
        assert report["node"] == {"labels_from": "this node's PCI ids (no verified install "
                                                 "yet)", "driver": "470.256.02"}
        status = {r["rule"]: r["status"] for r in report["workloads"][0]["rules"]}
        assert (status["gpu-type"], status["cuda"]) == ("pass", "fail")


def _pod(product: str, cuda: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeSelector": {P + "gpu.product": product},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": "cuda",
                                 "env": [{"name": "CUDA_VERSION", "value": cuda}],
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})


def test_install_labels_the_node_with_the_product(tmp_path: Path,
                                                  api: tuple[str, FakeApi]) -> None:
    """Acceptance: after `install`, `kubectl get nodes -L gpu-node-installer/gpu.product`
    shows the product; here, the patch the API server received carries it."""
    scene = make_scene(tmp_path)
    add_version(scene, VERSION)
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("tok\n")
    url, fake = api
    env = {**standin_env(VERSION), "FAKE_NVML_NAME": "Tesla T4", "FAKE_NVML_COMPUTE": "7.5"}
    with MirrorServer(scene.repo) as server:
        done = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                               "--node-name", "gpu-1", "--kube-api", url,
                                               "--service-account-dir", str(account))], env)
    assert done.returncode == 0, done.stderr[-2000:]
    (patch,) = fake.patches
    _valid_patch(patch)
    assert fake.merged_labels()[P + "gpu.product"] == "Tesla-T4"
    assert fake.merged_labels()[P + "gpu.family"] == "turing"
