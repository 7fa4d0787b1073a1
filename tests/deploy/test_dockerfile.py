"""The Dockerfile passes hadolint and keeps the promises the manifests and docs rely on."""

from __future__ import annotations

import re
import subprocess

from deploy.manifests import REPO, installer_env_vars, tool
from installer import __version__

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    pairs = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


class TestDockerfile:
    """Lint and structure."""

    def test_hadolint_passes(self) -> None:
        proc = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_hadolint_is_not_a_rubber_stamp(self, tmp_path) -> None:
        bad = tmp_path / "Dockerfile"
        bad.write_text("FROM debian:latest\nRUN apt-get install curl\n")
        proc = subprocess.run([tool("hadolint"), "--no-color", str(bad)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode != 0 and "DL3007" in proc.stdout

    def test_multi_stage_from_a_chosen_base(self) -> None:
        instructions = _instructions()
        froms = [args for key, args in instructions if key == "FROM"]
        assert froms == ["${BASE_IMAGE} AS base",
                         "--platform=${BUILDPLATFORM} ${BASE_IMAGE} AS builder",
                         "base AS runtime", "runtime AS build", "runtime"]
        assert instructions[0][0] == "ARG" and instructions[0][1].startswith("BASE_IMAGE=")

    def test_default_target_is_the_runtime_unchanged(self) -> None:
        """`podman build` without --target builds the last stage: the small runtime."""
        instructions = _instructions()
        last = max(i for i, (k, _) in enumerate(instructions) if k == "FROM")
        assert instructions[last:] == [("FROM", "runtime")]

    def test_build_target_adds_the_compiler_and_turns_the_fallback_on(self) -> None:
        instructions = _instructions()
        start = instructions.index(("FROM", "runtime AS build"))
        stage = instructions[start:instructions.index(("FROM", "runtime"))]
        runs = " ".join(args for key, args in stage if key == "RUN")
        for package in ('"${KERNEL_CC}"', "make", "libc6-dev", "libelf-dev"):
            assert f" {package} " in f" {runs} ", package
        assert "--no-install-recommends" in runs and "rm -rf /var/lib/apt/lists/*" in runs
        assert ("ARG", "KERNEL_CC=gcc-12") in stage
        assert ("ENV", "BUILD_FALLBACK=auto") in stage
        runtime = instructions[instructions.index(("FROM", "base AS runtime")):start]
        assert "apt-get" not in " ".join(args for _, args in runtime)

    def test_final_stage_installs_wheels_not_sources(self) -> None:
        instructions = _instructions()
        final = instructions[instructions.index(("FROM", "base AS runtime")):
                             instructions.index(("FROM", "runtime AS build"))]
        sources = [args.split()[:-1] for key, args in final if key == "COPY"]
        # the builder's venv, the command's link and the preloaded dir; never the source tree
        assert sources == [["--from=builder", "/opt/gpu-node-installer"],
                           ["--from=builder", "/link/"], ["${PRELOADED_DIR}/"]], sources
        builder = instructions[:instructions.index(("FROM", "base AS runtime"))]
        runs = " ".join(args for key, args in builder if key == "RUN")
        assert "--no-index --find-links /wheels" in runs
        assert "--only-binary=:all: \"$@\"" in runs

    def test_no_step_of_the_default_target_runs_the_target_platform(self) -> None:
        """The builder runs on the build machine's platform; the runtime stage only copies,
        so an arm64 image builds on x86_64 without emulating a single step."""
        instructions = _instructions()
        runtime = instructions[instructions.index(("FROM", "base AS runtime")):
                               instructions.index(("FROM", "runtime AS build"))]
        assert [key for key, _ in runtime if key == "RUN"] == []
        builder = instructions[:instructions.index(("FROM", "base AS runtime"))]
        assert ("ARG", "TARGETARCH") in builder

    def test_entrypoint_and_default_command(self) -> None:
        instructions = dict(_instructions())
        assert instructions["ENTRYPOINT"] == '["gpu-node-installer"]'
        assert instructions["CMD"] == '["install"]'

    def test_version_argument_is_this_version(self) -> None:
        args = [a for k, a in _instructions() if k == "ARG"]
        assert f"VERSION={__version__}" in args
        assert any(a.startswith("PRELOADED_DIR=") for a in args)

    def test_oci_labels(self) -> None:
        labels = " ".join(a for k, a in _instructions() if k == "LABEL")
        for key in ("title", "description", "source", "version", "licenses"):
            assert f"org.opencontainers.image.{key}=" in labels
        assert 'org.opencontainers.image.version="${VERSION}"' in labels

    def test_env_is_read_by_the_installer_or_python(self) -> None:
        env = " ".join(a for k, a in _instructions() if k == "ENV")
        names = set(re.findall(r"([A-Z_][A-Z0-9_]*)=", env))
        assert "DRIVER_PRELOADED_DIR" in names
        assert names - installer_env_vars() <= {"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert lines[lines.index("*")] == "*"
    assert {"!installer/", "!pyproject.toml", "!README.md", "!daemonset/preloaded/"} <= set(lines)
