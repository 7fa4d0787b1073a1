"""`make image PLATFORMS=...`: the build it starts, dry-run (`make -n`), for podman
(one manifest list, made afresh) and docker (buildx), and image.md's documented line.
The real build is tests/deploy/test_image_multiarch.py (image tier)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.manifests import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

BOTH = "linux/amd64,linux/arm64"
MARK = "# tested with make -n: tests/deploy/test_make_platforms.py::"


def dry_run(*args: str) -> list[str]:
    """The commands `make -n image ...` would run, continuation lines joined."""
    proc = subprocess.run(["make", "-s", "-n", "-C", str(REPO), "-o", "venv",
                           f"BIN={Path(sys.executable).parent}", "image", *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return [" ".join(line.split()) for line in proc.stdout.replace("\\\n", " ").splitlines()]


def test_podman_builds_one_manifest_list_for_every_platform() -> None:
    commands = dry_run(f"PLATFORMS={BOTH}", "CONTAINER_ENGINE=/usr/bin/podman",
                       "IMAGE=localhost/gni:1")
    (build,) = [c for c in commands if c.startswith("/usr/bin/podman build ")]
    assert f" --platform {BOTH} --manifest localhost/gni:1 ." in build, build
    # podman 4.3 expands `FROM --platform=$BUILDPLATFORM` only when it is passed
    native = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    assert f" --build-arg BUILDPLATFORM=linux/{native} " in build, build
    assert " -t " not in build
    # a list of that name from an earlier build is removed first, or the build would add a
    # second image per platform to it
    (reset,) = [c for c in commands if "manifest rm" in c]
    assert reset.startswith("/usr/bin/podman manifest exists localhost/gni:1 && "), reset
    assert commands.index(reset) < commands.index(build)


def test_docker_builds_with_buildx() -> None:
    commands = dry_run(f"PLATFORMS={BOTH}", "CONTAINER_ENGINE=/usr/bin/docker",
                       "IMAGE=localhost/gni:1", "IMAGE_BUILD_FLAGS=--push")
    (build,) = [c for c in commands if c.startswith("/usr/bin/docker ")]
    assert build.startswith("/usr/bin/docker buildx build --push "), build
    assert build.endswith(f" --platform {BOTH} -t localhost/gni:1 .")
    assert not [c for c in commands if "manifest" in c]
    assert "BUILDPLATFORM" not in build  # buildx sets it itself


def test_without_platforms_the_build_is_the_native_one() -> None:
    commands = dry_run("CONTAINER_ENGINE=/usr/bin/podman", "IMAGE=localhost/gni:1")
    (build,) = [c for c in commands if c.startswith("/usr/bin/podman ")]
    assert build.startswith("/usr/bin/podman build ") and build.endswith(" -t localhost/gni:1 .")
    assert "--platform" not in build and "manifest" not in " ".join(commands)


def test_the_documented_multiarch_command() -> None:
    """image.md's line under its marker builds the list it names."""
    text = (REPO / "docs" / "image.md").read_text(encoding="utf-8")
    block = text.split(MARK + "test_the_documented_multiarch_command\n", 1)[1]
    line = block.split("\n```", 1)[0].replace("\\\n", " ").split("#", 1)[0]
    words = line.split()
    assert words[:2] == ["make", "image"], line
    settings = dict(word.split("=", 1) for word in words[2:])
    assert settings["PLATFORMS"] == BOTH
    commands = dry_run(*words[2:], "CONTAINER_ENGINE=/usr/bin/podman")
    (build,) = [c for c in commands if c.startswith("/usr/bin/podman build ")]
    assert re.search(rf" --platform {BOTH} --manifest {re.escape(settings['IMAGE'])} \.$",
                     build), build
