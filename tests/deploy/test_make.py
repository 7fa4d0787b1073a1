"""`make manifests` renders what the tests validate; `make image` passes the right arguments."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy.manifests import OVERLAYS, REPO, render
from installer import __version__

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> subprocess.CompletedProcess[str]:
    """Make in the repository, with this interpreter's virtualenv, never rebuilding it."""
    return subprocess.run(["make", "-s", "-C", str(REPO), "-o", "venv",
                           f"BIN={Path(sys.executable).parent}", *args],
                          capture_output=True, text=True, timeout=300, check=False)


def test_manifests_renders_every_overlay_and_the_examples(tmp_path: Path) -> None:
    proc = make("manifests", f"MANIFESTS_DIR={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted([*(f"{o}.yaml" for o in OVERLAYS), "examples.yaml"])
    for overlay in OVERLAYS:
        docs = tuple(d for d in yaml.safe_load_all((tmp_path / f"{overlay}.yaml").read_text())
                     if d)
        assert docs == render(f"overlays/{overlay}")


@pytest.mark.parametrize("engine", ["/usr/bin/podman", "/usr/bin/docker"])
def test_image_build_command(engine: str) -> None:
    proc = make("-n", "image", f"CONTAINER_ENGINE={engine}", "BASE_IMAGE=localhost/base:1",
                "PIP_CA=/etc/ca.pem")
    assert proc.returncode == 0, proc.stderr
    command = " ".join(proc.stdout.replace("\\\n", " ").split())
    assert f"{engine} build" in command
    assert ("--isolation chroot" in command) == engine.endswith("podman")
    for part in ("--build-arg BASE_IMAGE=localhost/base:1", f"--build-arg VERSION={__version__}",
                 "--build-arg PRELOADED_DIR=daemonset/preloaded",
                 "--secret id=pip-ca,src=/etc/ca.pem",
                 f"-t ghcr.io/gpu-node-installer/gpu-node-installer:{__version__} ."):
        assert part in command, command


def test_image_without_an_engine_says_so() -> None:
    proc = make("image", "CONTAINER_ENGINE=")
    assert proc.returncode != 0
    assert "needs podman or docker" in proc.stderr
