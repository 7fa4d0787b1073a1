"""`make push` (docs/deploy.md's first steps): the image built by the image tier goes to a real
registry (Debian's docker-registry, started here on 127.0.0.1 with its storage in the test's
temp dir), the printed digest is what the registry serves, and the overlay it pins renders to
strictly valid manifests whose pods run exactly that digest, with the pull secret asked for.
The overlay script's refusals and the engine commands run without a registry."""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from deploy import podman
from deploy.manifests import REPO, pod_spec, tool, workloads

KUBERNETES_VERSIONS = ("1.28.0", "1.33.0")
MANIFEST_TYPES = ", ".join(("application/vnd.oci.image.manifest.v1+json",
                            "application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.index.v1+json"))
DIGEST = "sha256:" + "ab" * 32

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(REPO), "-o", "venv",
                           f"BIN={Path(sys.executable).parent}", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def pin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "pin-image.py"), *args],
                          capture_output=True, text=True, timeout=30, check=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """docker-registry on 127.0.0.1:<free port>, its config and storage in tmp_path."""
    program = shutil.which("docker-registry")
    if program is None:
        pytest.skip("docker-registry is not installed (scripts/install-deps.sh installs it)")
    address = f"127.0.0.1:{_free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry-data")}},
        "http": {"addr": address}}))
    log = (tmp_path / "registry.log").open("w")
    server = subprocess.Popen([program, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://{address}/v2/", timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "registry.log").read_text()
                assert time.monotonic() < deadline, "the registry did not answer in 10 s"
                time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def _render(overlay: Path) -> tuple[dict, ...]:
    proc = subprocess.run([tool("kubectl"), "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    return docs


@pytest.mark.image
@pytest.mark.timeout(1800)
def test_push_to_a_local_registry_and_deploy_by_digest(
        registry: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    image = podman.project_image(tmp_path_factory)  # the image tier's build: podman's cache
    overlay = tmp_path / "my-cluster"
    args = ("push", f"CONTAINER_ENGINE=podman {' '.join(podman.GLOBAL)}", f"IMAGE={image}",
            f"REGISTRY={registry}/gni", f"OVERLAY={overlay}", "PUSH_FLAGS=--tls-verify=false",
            f"PUSH_DIGEST_FILE={tmp_path / 'digest'}", "PULL_SECRET=regcred")
    repository = f"{registry}/gni/gpu-node-installer"
    started = time.monotonic()
    try:
        _push_and_deploy(args, repository, registry, overlay)
    finally:  # the tag `make push` gave the image in the local store
        podman.podman("untag", image, f"{repository}:{image.rsplit(':', 1)[1]}", check=False)
    print(f"\nmake push twice, checks: {time.monotonic() - started:.1f} s", file=sys.stderr)


def _push_and_deploy(args: tuple[str, ...], repository: str, registry: str,
                     overlay: Path) -> None:
    pushed = make(*args)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    (digest,) = re.findall(rf"^pushed {re.escape(repository)}@(sha256:[0-9a-f]{{64}})$",
                           pushed.stdout, re.MULTILINE)

    request = urllib.request.Request(
        f"http://{registry}/v2/gni/gpu-node-installer/manifests/{digest}",
        headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        served = answer.read()
    assert f"sha256:{hashlib.sha256(served).hexdigest()}" == digest

    docs = _render(overlay)
    daemonset, = [d for d in workloads(docs) if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    images = {c["image"] for c in (*spec["initContainers"], *spec["containers"])}
    assert images == {f"{repository}@{digest}"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]

    # A second push rewrites the pin, never the overlay that is now the user's.
    mine = overlay / "kustomization.yaml"
    mine.write_text(mine.read_text() + "# my own line\n")
    again = make(*args[:-1])  # without PULL_SECRET this time
    assert again.returncode == 0, again.stderr
    assert mine.read_text().endswith("# my own line\n")
    assert "imagePullSecrets" not in (overlay / "image" / "kustomization.yaml").read_text()
    assert "imagePullSecrets" not in pod_spec(
        next(d for d in workloads(_render(overlay)) if d["kind"] == "DaemonSet"))


def test_pin_image_refuses_the_shipped_overlays_and_a_bad_digest(tmp_path: Path) -> None:
    shipped = REPO / "daemonset" / "overlays" / "gke-cos"
    before = {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()}
    refused = pin("--overlay", str(shipped), "--repository", "r.example/gni/x",
                  "--digest", DIGEST)
    assert refused.returncode == 2
    assert "inside the shipped daemonset/" in refused.stderr
    assert {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()} == before
    for bad in ("sha256:abc", "latest", ""):
        proc = pin("--overlay", str(tmp_path / "o"), "--repository", "r.example/gni/x",
                   "--digest", bad)
        assert proc.returncode == 2 and "not an image digest" in proc.stderr
    proc = pin("--overlay", str(tmp_path / "o"), "--repository", "r.example/gni/x",
               "--digest", DIGEST, "--pull-secret", "Bad Name")
    assert proc.returncode == 2 and "not a Secret name" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("base", ["daemonset/overlays/ubuntu",
                                  "daemonset/examples/build-farm/shards",
                                  "daemonset/examples/build-farm/index"])
def test_pinned_overlays_render_on_every_documented_base(tmp_path: Path, base: str) -> None:
    """The deploy, build-farm and COS pages' `make push ... OVERLAY_BASE=` targets: every
    workload of the installer's image runs the pinned digest, pull secret and all."""
    overlay = tmp_path / "mine"
    proc = pin("--overlay", str(overlay), "--repository", "r.example/gni/gpu-node-installer",
               "--digest", DIGEST, "--base", base, "--pull-secret", "regcred")
    assert proc.returncode == 0, proc.stderr
    for workload in workloads(_render(overlay)):
        spec = pod_spec(workload)
        ours = [c["image"] for c in (*spec.get("initContainers", []), *spec["containers"])
                if "gpu-node-installer" in c["image"]]
        assert ours and set(ours) == {f"r.example/gni/gpu-node-installer@{DIGEST}"}
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_an_overlay_without_the_component_is_left_alone_and_named(tmp_path: Path) -> None:
    overlay = tmp_path / "mine"
    overlay.mkdir()
    text = "resources:\n  - ../elsewhere\n"
    (overlay / "kustomization.yaml").write_text(text)
    proc = pin("--overlay", str(overlay), "--repository", "r.example/gni/gpu-node-installer",
               "--digest", DIGEST)
    assert proc.returncode == 0
    assert "does not list the component" in proc.stderr
    assert (overlay / "kustomization.yaml").read_text() == text
    assert DIGEST in (overlay / "image" / "kustomization.yaml").read_text()


@pytest.mark.parametrize(("engine", "extra", "expected"), [
    ("/usr/bin/podman", (), ["/usr/bin/podman tag {image} r.example/gni/gpu-node-installer:{v}",
                             "/usr/bin/podman push --tls-verify=false --digestfile {digest} "
                             "r.example/gni/gpu-node-installer:{v}"]),
    ("/usr/bin/podman", ("PLATFORMS=linux/amd64,linux/arm64",),
     ["/usr/bin/podman manifest push --all --tls-verify=false --digestfile {digest} {image} "
      "docker://r.example/gni/gpu-node-installer:{v}"]),
    ("/usr/bin/docker", (), ["/usr/bin/docker push --tls-verify=false "
                             "r.example/gni/gpu-node-installer:{v}"]),
])
def test_push_commands(engine: str, extra: tuple[str, ...], expected: list[str],
                       tmp_path: Path) -> None:
    from installer import __version__

    image = f"ghcr.io/gpu-node-installer/gpu-node-installer:{__version__}"
    digest = tmp_path / "digest"
    proc = make("-n", "push", f"CONTAINER_ENGINE={engine}", "REGISTRY=r.example/gni",
                "PUSH_FLAGS=--tls-verify=false", f"PUSH_DIGEST_FILE={digest}", *extra)
    assert proc.returncode == 0, proc.stderr
    commands = " ".join(proc.stdout.replace("\\\n", " ").split())
    for command in expected:
        assert command.format(image=image, v=__version__, digest=digest) in commands, commands


def test_push_without_a_registry_says_so() -> None:
    proc = make("push", "CONTAINER_ENGINE=/usr/bin/podman")
    assert proc.returncode != 0
    assert "set REGISTRY=host[:port]/path" in proc.stderr


def test_the_documented_first_step_builds_then_pushes_and_pins() -> None:
    """deploy.md's first command, under its `# tested:` marker naming the registry test above,
    dry-run: the image build, then the push and the pin that test runs for real."""
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    marker = ("# tested: tests/deploy/test_push.py::"
              "test_push_to_a_local_registry_and_deploy_by_digest")
    (command,) = re.findall(rf"^{re.escape(marker)}\n(make [^\n]*)$", text, re.MULTILINE)
    assert command.startswith("make image push REGISTRY=") and " OVERLAY=" in command
    proc = make("-n", *command.split()[1:], "CONTAINER_ENGINE=/usr/bin/podman")
    assert proc.returncode == 0, proc.stderr
    commands = " ".join(proc.stdout.replace("\\\n", " ").split())
    registry = command.split("REGISTRY=")[1].split()[0]
    overlay = command.split("OVERLAY=")[1].split()[0]
    build = commands.index("/usr/bin/podman build")
    push = commands.index(f"/usr/bin/podman push --digestfile build/push.digest {registry}/")
    pin_at = commands.index(f"scripts/pin-image.py --overlay {overlay} ")
    assert build < push < pin_at
