"""End-to-end fixtures for `install`: a node tree, a driver repository, a real HTTP mirror.

The package holds simulated kernel modules (real ELF `.modinfo`, loaded by FakeKernelHost)
and the compiled NVML/CUDA stand-ins as its libraries, so `verify` runs the real pynvml.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers import node_args
from native import build_standins
from native.packages import standin_tree

from installer.packages.builder import BuildRequest, build
from installer.testing import SAMPLE_NODES, NodeSpec, build_node
from installer.testing.kernel import fake_module_set

FAKENODE = Path(__file__).resolve().parent / "fakenode.py"
NODE = "gke-ubuntu-t4"
KERNEL = SAMPLE_NODES[NODE].kernel
INSTALL_DIR = "home/kubernetes/bin/nvidia"


@dataclass
class Scene:
    """One node plus one repository directory that a mirror serves."""

    root: Path
    repo: Path
    work: Path

    @property
    def install_dir(self) -> Path:
        return self.root / INSTALL_DIR

    def args(self, *extra: str) -> list[str]:
        return [*node_args(self.root), "--log-format", "json", *extra]


def make_scene(base: Path, spec: NodeSpec | None = None) -> Scene:
    """A node (the sample NODE, or `spec`) under `base`, beside an empty repository and work
    dir."""
    root = base / "node"
    root.mkdir()
    build_node(root, spec or SAMPLE_NODES[NODE])
    scene = Scene(root, base / "repo", base / "work")
    scene.work.mkdir()
    return scene


def add_version(scene: Scene, version: str, *, aliases: tuple[str, ...] = ("default", "latest"),
                padding: int = 0, broken_nvml: bool = False, flavour: str = "proprietary",
                extra_modules: dict[str, bytes] | None = None) -> str:
    """Build a package of `version` into the repository; returns its manifest digest.

    `padding` bytes of extra (ELF) library make fetch and stage take measurable time;
    `broken_nvml` builds an NVML stand-in without nvmlSystemGetDriverVersion (error 13);
    `extra_modules` are more module files (`nvidia-peermem.ko`: shipped, not listed).
    """
    work = scene.work / f"{version}-{flavour}-{padding}-{broken_nvml}"
    built = build_standins(work / "built", omit_driver_version=broken_nvml)
    tree = standin_tree(work / "tree", built, version)
    if padding:
        lib = tree / "usr/lib/x86_64-linux-gnu/nvidia/current"
        _padding_library(work, lib / f"libnvidia-padding.so.{version}", padding)
    fake_module_set(work / "modules", version, kernel_release=KERNEL)
    for name, data in (extra_modules or {}).items():
        (work / "modules" / name).write_bytes(data)
    result = build(BuildRequest(trees=(tree,), modules_dir=work / "modules",
                                driver_version=version, kernel_release=KERNEL,
                                flavour=flavour, repo=scene.repo, aliases=aliases,
                                force=True))
    return result.digest


def _padding_library(work: Path, dest: Path, size: int) -> None:
    """A real (empty) shared library followed by `size` random bytes."""
    source = work / "padding.c"
    source.write_text("int gni_padding(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-padding.so.1", "-o",
                    str(dest), str(source)], check=True)
    with dest.open("ab") as handle:  # in chunks: keep this process's peak RSS small
        for offset in range(0, size, 1 << 20):
            handle.write(os.urandom(min(1 << 20, size - offset)))


def standin_env(version: str, gpus: int = 1) -> dict[str, str]:
    """What the NVML/CUDA stand-ins report (the real libraries would ask the kernel)."""
    return {**os.environ, "FAKE_NVML_DRIVER": version, "FAKE_NVML_GPUS": str(gpus),
            "FAKE_CUDA_DEVICES": str(gpus), "FAKE_NVML_BUS_IDS": "00000000:00:04.0"}


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FAKENODE), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)


def events(stderr: str) -> list[dict[str, object]]:
    """The JSON log events of a run."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
