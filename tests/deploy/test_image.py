"""The image really builds (podman, from a local Debian base) and the installer runs in it:
`--version`, `detect` against a sample node's host tree bind-mounted in, the default command
with an overlay's rendered settings, the example's `wait-ready`, the agent's readiness probe
commands, and what the Dockerfile promises (entrypoint, labels, wheels, no pip, preloaded,
the SBOM of exactly what is installed, which `status` names by digest)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import podman
from deploy.manifests import REPO, container_env, mounts_by_volume, one, pod_spec, render
from installer import __version__
from installer.errors import error_table

# The first test also makes the rootfs and builds the image: allow a slow mirror.
pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

TAG = podman.PROJECT_TAG
PRELOADED = "/var/lib/gpu-node-installer/preloaded"
(MARKER,) = podman.PROJECT_PRELOADED  # the file the build context adds to preloaded/


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return podman.project_image(tmp_path_factory)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample GKE A100x8 node, written by the documented command."""
    root = tmp_path_factory.mktemp("node") / "gke-cos-a100x8"
    subprocess.run([sys.executable, "-m", "installer.testing", "gke-cos-a100x8", str(root)],
                   check=True, capture_output=True, timeout=60)
    return root


def programs_the_installer_runs() -> set[str]:
    found: set[str] = set()
    for source in (REPO / "installer").rglob("*.py"):
        found.update(re.findall(r"""host\.run\(\s*\[\s*["']([\w.-]+)["']""",
                                source.read_text(encoding="utf-8")))
    return found


def _detect_args(root: str) -> list[str]:
    return ["detect", "--host-root", root, "--proc-root", f"{root}/proc",
            "--sys-root", f"{root}/sys", "--output", "json"]


class TestImage:
    """What the DaemonSet relies on, checked in the built image."""

    def test_version(self, image: str) -> None:
        proc = podman.run(image, "--version")
        assert proc.stdout.strip() == f"gpu-node-installer, version {__version__}"

    def test_detect_on_a_sample_node(self, image: str, node: Path) -> None:
        """Same report inside the image as from the source tree on this machine."""
        inside = podman.run(image, *_detect_args("/node"), volumes=(f"{node}:/node:ro",))
        report = json.loads(inside.stdout)
        assert report["os"]["id"] == "cos"
        assert len(report["gpus"]) == 8
        assert {gpu["name"] for gpu in report["gpus"]} == {"A100 SXM4 40GB"}
        outside = subprocess.run([sys.executable, "-m", "installer", *_detect_args(str(node))],
                                 capture_output=True, text=True, check=True, timeout=60)
        assert report == json.loads(outside.stdout)

    def test_default_command_with_the_rendered_settings(
            self, image: str, node: Path, tmp_path: Path) -> None:
        """The DaemonSet's init container, as far as a machine without a GPU allows: the
        image's default command with the gke-cos overlay's settings and mounts. The settings
        are accepted (not exit 2), and the failure (no package anywhere) reaches the
        termination log as one line whose slug matches the exit code."""
        docs = render("overlays/gke-cos")
        spec = pod_spec(one(docs, "DaemonSet", "gpu-node-installer"))
        (installer,) = spec["initContainers"]
        assert installer["args"] == ["install"]  # the image's CMD, so no args below
        env = {k: v for k, v in container_env(installer, docs).items() if v is not None}
        host_root, node_copy = env["HOST_ROOT"], tmp_path / "node"
        shutil.copytree(node, node_copy, symlinks=True)
        env |= {"NODE_NAME": "gke-gpu-node-1", "PROC_ROOT": f"{host_root}/proc",
                "SYS_ROOT": f"{host_root}/sys", "TERMINATION_LOG": "/tl/termination-log"}
        params_dir = tmp_path / "module-params"
        params_dir.mkdir()
        params_cm = next(v["configMap"]["name"] for v in spec["volumes"]
                         if v["name"] == "module-params")
        for name, text in one(docs, "ConfigMap", params_cm)["data"].items():
            (params_dir / name).write_text(text)
        (tmp_path / "tl").mkdir()
        (tmp_path / "dev").mkdir()
        mounts = mounts_by_volume(installer)
        volumes = (f"{node_copy}:{host_root}", f"{tmp_path / 'dev'}:{env['DEV_ROOT']}",
                   f"{params_dir}:{mounts['module-params']}:ro", f"{tmp_path / 'tl'}:/tl")
        env_args = [arg for name, value in sorted(env.items()) for arg in ("-e", f"{name}={value}")]
        proc = podman.podman("run", *podman.RUN, *env_args,
                             *[arg for v in volumes for arg in ("-v", v)], image, check=False)
        slugs = {cls.code: cls.slug for cls in error_table()}
        assert proc.returncode in slugs and proc.returncode not in (1, 2), proc.stderr
        line = (tmp_path / "tl" / "termination-log").read_text()
        assert line.startswith(f"error({slugs[proc.returncode]}): "), line
        assert line.count("\n") == 1

    def test_device_plugin_example_waits_for_readiness(
            self, image: str, node: Path, tmp_path: Path) -> None:
        """The example's `wait-for-driver` init container, read-only root and all: not ready
        (exit 12) until `.ready.json` names the driver version the kernel has loaded."""
        docs = render("examples")
        spec = pod_spec(one(docs, "DaemonSet", "nvidia-gpu-device-plugin"))
        (wait,) = spec["initContainers"]
        env = {k: v for k, v in container_env(wait, docs).items() if v is not None}
        install_dir = tmp_path / "install-dir"
        install_dir.mkdir()
        node_copy = tmp_path / "node"
        shutil.copytree(node, node_copy, symlinks=True)
        (node_copy / "sys" / "module" / "nvidia").mkdir(parents=True)
        (node_copy / "sys" / "module" / "nvidia" / "version").write_text("535.261.03\n")
        # The kernel's state comes from the node's own /proc and /sys in a pod; here, the
        # sample node's.
        env |= {"PROC_ROOT": "/node/proc", "SYS_ROOT": "/node/sys"}
        env_args = [arg for name, value in sorted(env.items()) for arg in ("-e", f"{name}={value}")]
        volumes = ["-v", f"{install_dir}:{mounts_by_volume(wait)['nvidia']}:ro",
                   "-v", f"{node_copy}:/node:ro"]
        args = [*wait["args"], "--timeout", "0", "--interval", "0.05"]

        def wait_ready() -> subprocess.CompletedProcess[str]:
            return podman.podman("run", *podman.RUN, "--read-only", *env_args, *volumes,
                                 image, *args, check=False)

        not_ready = wait_ready()
        assert not_ready.returncode == 12, not_ready.stderr
        assert "not ready" in not_ready.stderr
        (install_dir / ".ready.json").write_text(json.dumps({"driver_version": "535.261.03",
                                                             "gpus": []}))
        ready = wait_ready()
        assert ready.returncode == 0, ready.stderr

    def test_entrypoint_command_labels_env(self, image: str) -> None:
        (config,) = json.loads(podman.podman("image", "inspect", image).stdout)
        assert config["Config"]["Entrypoint"] == ["gpu-node-installer"]
        assert config["Config"]["Cmd"] == ["install"]
        labels = config["Config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == __version__
        assert labels["org.opencontainers.image.title"] == "gpu-node-installer"
        assert f"DRIVER_PRELOADED_DIR={PRELOADED}" in config["Config"]["Env"]

    def test_installed_from_a_wheel_without_pip(self, image: str) -> None:
        code = ("import importlib.util, installer; print(installer.__file__); "
                "print(importlib.util.find_spec('pip'))")
        proc = podman.run(image, "-c", code, entrypoint="/opt/gpu-node-installer/bin/python")
        location, pip = proc.stdout.split()
        assert "/site-packages/installer/" in location
        assert pip == "None"
        assert podman.run(image, "-e", "/src", entrypoint="test", check=False).returncode == 1

    def test_programs_the_installer_runs_are_in_the_image(self, image: str) -> None:
        """Every program named first in a `host.run([...])` call in the installer's code."""
        programs = sorted(programs_the_installer_runs())
        assert "chroot" in programs  # the node's ldconfig runs in a chroot
        script = " && ".join(f"command -v {name}" for name in programs)
        found = podman.run(image, "-c", script, entrypoint="sh").stdout.split()
        assert len(found) == len(programs), (programs, found)

    def test_preloaded_packages_are_baked_in(self, image: str) -> None:
        listing = podman.run(image, "-A", PRELOADED, entrypoint="ls").stdout.split()
        assert listing == [MARKER]  # the directory's README stays out (.dockerignore)

    def test_the_agent_probe_runs_in_the_image(self, image: str, tmp_path: Path) -> None:
        """The DaemonSet's readinessProbe (`agent --probe`) runs in this image: not ready
        without the agent's view, ready with a fresh one that says so."""
        spec = pod_spec(one(render("overlays/gke-cos"), "DaemonSet", "gpu-node-installer"))
        (agent,) = spec["containers"]
        assert agent["args"] == ["agent"]
        probe, *probe_args = agent["readinessProbe"]["exec"]["command"]
        install = tmp_path / "host/home/kubernetes/bin/nvidia"
        install.mkdir(parents=True)
        args = (*probe_args, "--host-root", "/root", "--termination-log", "/tmp/t")
        volume = (f"{tmp_path / 'host'}:/root:ro",)
        assert podman.run(image, *args, entrypoint=probe, volumes=volume,
                          check=False).returncode == 12
        (install / ".agent.json").write_text(json.dumps(
            {"ready": True, "reason": "fabric complete", "updated_at": time.time()}))
        assert podman.run(image, *args, entrypoint=probe, volumes=volume,
                          check=False).returncode == 0


def test_a_wheel_not_in_the_lock_stops_the_build(tmp_path: Path) -> None:
    """--require-hashes really checks: with every hash of one pin replaced, the builder
    stage fails on that wheel's download and no image is made."""
    reason = podman.why_podman_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    base, _, _ = podman.base_image()
    context = podman.build_context(tmp_path / "context", {})
    lock = context / "requirements" / "runtime.txt"
    text = lock.read_text()
    pin = re.search(r"^(idna==[^ ]+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)",
                    text, re.MULTILINE)
    assert pin, "idna is no longer in the lock: pick another pure-Python pin"
    forged = re.sub(r"[0-9a-f]{64}", "0" * 64, pin.group(2))
    lock.write_text(text.replace(pin.group(0), f"{pin.group(1)} \\\n{forged}"))
    tag = "localhost/gpu-node-installer:test-forged-lock"
    proc = podman.podman("build", "--isolation", "chroot", "--pull=never", "--network", "host",
                         "--build-arg", f"BASE_IMAGE={base}", "--target", "builder",
                         *(["--secret", f"id=pip-ca,src={podman.ca_bundle()}"]
                           if podman.ca_bundle() else []),
                         "-t", tag, str(context), timeout=600, check=False)
    assert proc.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in proc.stdout + proc.stderr
    assert re.search(r"idna.*\n.*Expected sha256 0{64}", proc.stdout + proc.stderr)
    assert podman.podman("image", "exists", tag, check=False).returncode != 0


class TestSbom:
    """The build's CycloneDX SBOM (docs/image.md) in the image."""

    SBOM = "/opt/gpu-node-installer/sbom.cdx.json"

    def test_it_lists_every_installed_distribution_with_its_version(self, image: str) -> None:
        """What the image's own interpreter finds installed, name and version, is what the
        SBOM lists: nothing missing, nothing extra."""
        code = ("import importlib.metadata as m, json; print(json.dumps(sorted("
                "[d.metadata['Name'], d.version] for d in m.distributions())))")
        installed = json.loads(podman.run(image, "-c", code,
                                          entrypoint="/opt/gpu-node-installer/bin/python").stdout)
        sbom = json.loads(podman.run(image, self.SBOM, entrypoint="cat").stdout)
        assert sbom["bomFormat"] == "CycloneDX"
        listed = sorted([c["name"], c["version"]] for c in sbom["components"])

        def canonical(pairs: list[list[str]]) -> list[tuple[str, str]]:
            return sorted((re.sub(r"[-_.]+", "-", name).lower(), version)
                          for name, version in pairs)

        assert canonical(listed) == canonical(installed)
        assert ["gpu-node-installer", __version__] in listed
        assert len(listed) >= 12  # the installer and its locked dependencies

    def test_status_shows_its_digest(self, image: str, node: Path) -> None:
        digest = podman.run(image, self.SBOM, entrypoint="sha256sum").stdout.split()[0]
        args = ("status", "--host-root", "/node", "--proc-root", "/node/proc",
                "--sys-root", "/node/sys")
        volume = (f"{node}:/node:ro",)
        report = json.loads(podman.run(image, *args, "-o", "json", volumes=volume).stdout)
        assert report["image"] == {"version": __version__, "sbom": self.SBOM,
                                   "sbom_sha256": digest}
        text = podman.run(image, *args, volumes=volume).stdout
        assert f"Image:           {__version__}, SBOM {self.SBOM} sha256:{digest}" in text

    def test_make_sbom_copies_it_out(self, image: str, tmp_path: Path) -> None:
        """image.md's `make sbom`: the file the image holds, copied out without running it."""
        inside = podman.run(image, self.SBOM, entrypoint="sha256sum").stdout.split()[0]
        out = tmp_path / "out" / "image.sbom.cdx.json"
        done = subprocess.run(
            ["make", "-s", "-C", str(REPO), "-o", "venv", "sbom", f"IMAGE={image}",
             f"CONTAINER_ENGINE=podman {' '.join(podman.GLOBAL)}", f"SBOM_OUT={out}"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [inside, str(out)]
        assert json.loads(out.read_text())["bomFormat"] == "CycloneDX"
