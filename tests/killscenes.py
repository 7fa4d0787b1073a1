"""The three kill-storm scenes (COS install, build fallback, repository build), each as
cheap as its path allows.

- `cos_scene`: `install` on a COS node from the cos-tools layout served over HTTPS (a
  small runfile: the NVML/CUDA stand-ins plus random padding, so a run is ~2 s); the cache
  is emptied before most runs, so almost every run downloads and assembles the package.
- `fallback_scene`: `install --build-fallback auto` on a node with the real Debian headers and
  a repository holding only a source package (stand-in module sources, really compiled with
  make and gcc-12); the cache is emptied before most runs, so each one builds again.
- `repo_scene`: `package build --repo` of three kernels' packages, each in two contents
  (same identity, other module bytes, so another manifest digest) into one repository,
  `--force` over what is there: new packages, identical rebuilds and replacements.

Each yields a `Storm` (argv per kill, checks) with its checks bound to the scene's dirs.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cosbucket import RUNFILE_BUCKET, cos_node, make_bucket
from cosrunfile import _stage_runfile, runfile_name
from cosserver import CosServer
from e2e import standin_env
from fallbacknode import headers_debs, make_node, unpack_headers
from helpers import node_args
from killstorm import Storm, check_cache, check_install, check_repo, cli
from native import build_standins
from native.packages import standin_tree
from nvsources import mini_source

from installer.packages.builder import BuildRequest, build
from installer.testing import SAMPLE_NODES
from installer.testing.kernel import elf_with_modinfo

VERSION = "535.261.03"
INSTALL = "home/kubernetes/bin/nvidia"
COS_NODE = SAMPLE_NODES["gke-cos-a100x8"]
COS_BUILD = "17800.218.20"  # the sample node's BUILD_ID
REPO_KERNELS = ("6.1.0-26-cloud-amd64", "6.1.0-27-cloud-amd64", "6.1.0-28-cloud-amd64")
WARM_EVERY = 5  # every fifth run keeps the cache: the reuse path is killed too


def _env(base: Path, version: str = VERSION, gpus: int = 1) -> dict[str, str]:
    """The stand-ins' answers, and a termination log inside the temp dir."""
    return {**standin_env(version, gpus), "TERMINATION_LOG": str(base / "termination-log")}


def _empty_cache(cache: Path, i: int) -> None:
    """Drop the cached packages (not the run folders, which the next run must clean)."""
    if i % WARM_EVERY:
        for name in ("blobs", "refs"):
            shutil.rmtree(cache / name, ignore_errors=True)


def _node_checks(root: Path, *, quiescent: bool = False) -> list[str]:
    install = root / INSTALL
    return check_cache(install / ".cache", quiescent=quiescent) + check_install(install)


def _node_storm(name: str, argv: list[str], env: dict[str, str], root: Path) -> Storm:
    """An `install` storm: the cache is emptied before most runs, so each one rebuilds."""
    return Storm(name, lambda _i: argv, env, lambda: _node_checks(root),
                 lambda: _node_checks(root, quiescent=True),
                 prepare=lambda i: _empty_cache(root / INSTALL / ".cache", i))


def _padded(source: Path, target: Path, padding: int) -> Path:
    """A copy of a library with `padding` random bytes after its ELF (the loader maps only
    what its program headers name)."""
    shutil.copyfile(source, target)
    with target.open("ab") as out:
        for _ in range(padding >> 20):
            out.write(os.urandom(1 << 20))
    return target


def small_runfile(bucket_root: Path, standins: Path, firmware: dict[str, bytes],
                  work: Path, *, padding: int = 0) -> Path:
    """NVIDIA's runfile layout with only the stand-ins (libcuda padded with `padding`
    random bytes) and a stand-in nvidia-smi."""
    work.mkdir(parents=True)
    smi, page = work / "nvidia-smi", work / "nvidia-smi.1.gz"
    smi.write_text("#!/bin/sh\necho stand-in\n")
    page.write_bytes(b"")
    cuda = _padded(standins / "libcuda.so.1", work / "libcuda.so.1", padding)
    staging = work / "stage" / f"NVIDIA-Linux-x86_64-{VERSION}"
    _stage_runfile(staging, VERSION, {f"libnvidia-ml.so.{VERSION}": standins / "libnvidia-ml.so.1",
                                      f"libcuda.so.{VERSION}": cuda,
                                      "nvidia-smi": smi, "nvidia-smi.1.gz": page}, firmware)
    target = bucket_root / RUNFILE_BUCKET / "tesla" / VERSION / runfile_name(VERSION)
    target.parent.mkdir(parents=True)
    subprocess.run(["makeself", "--nox11", "--quiet", str(staging), str(target),
                    f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {VERSION}",
                    "./nvidia-installer"], check=True, stdout=subprocess.DEVNULL)
    return target


@contextmanager
def cos_scene(base: Path, *, padding: int = 24 << 20) -> Iterator[Storm]:
    """`padding` bytes in the runfile make downloading and assembling the larger part of a
    run, as they are on a node (NVIDIA's real runfile is ~300 MB)."""
    standins = build_standins(base / "standins")
    bucket = make_bucket(base / "cos", build_id=COS_BUILD, kernel_release=COS_NODE.kernel,
                         version=VERSION, runfile=False)
    small_runfile(bucket.root, standins, bucket.firmware, base / "runfile", padding=padding)
    root = cos_node(base / "node", COS_NODE)
    with CosServer(bucket.root) as server:
        assert server.ca_bundle is not None
        argv = cli("install", *node_args(root), "--log-format", "json", "--cos-tools-url",
                   server.cos_tools_url, "--nvidia-runfile-url", server.runfile_url,
                   "--ca-bundle", str(server.ca_bundle),
                   "--fabric-manager", "host")  # COS packages carry no Fabric Manager
        yield _node_storm("cos assembly", argv, _env(base, gpus=8), root)


def fallback_available() -> str | None:
    """Why the on-node build cannot run on this machine, or None when it can."""
    if headers_debs() is None:
        return "needs dpkg-deb and gcc-12 (the kernel's compiler): make deps"
    return None


@contextmanager
def fallback_scene(base: Path) -> Iterator[Storm]:
    debs = headers_debs()
    assert debs is not None, fallback_available()
    headers = unpack_headers(debs, base / "headers")
    tree = standin_tree(base / "tree", build_standins(base / "built"), VERSION)
    repo = base / "repo"
    build(BuildRequest(trees=(tree,), nvidia_source=mini_source(base / "nv"), repo=repo,
                       aliases=("default",)))
    root = make_node(base / "node", headers)
    argv = cli("install", *node_args(root), "--log-format", "json", "--mirror",
               f"file://{repo}", "--driver-version", VERSION, "--build-fallback", "auto")
    yield _node_storm("on-node build", argv, _env(base), root)


def stand_in_modules(directory: Path, kernel: str, variant: str) -> Path:
    """Stand-in open modules for `kernel`; `variant` changes their bytes, not identity."""
    directory.mkdir(parents=True)
    for stem, depends in (("nvidia", ""), ("nvidia-uvm", "nvidia"),
                          ("nvidia-modeset", "nvidia")):
        (directory / f"{stem}.ko").write_bytes(elf_with_modinfo([
            f"version={VERSION}", "license=Dual MIT/GPL", f"depends={depends}",
            f"srcversion={variant}", f"name={stem.replace('-', '_')}",
            f"vermagic={kernel} SMP preempt mod_unload modversions "]))
    return directory


def _leftovers(repo: Path) -> set[str]:
    return {str(p.relative_to(repo)) for p in repo.rglob(".*") if not p.name.endswith(".lock")}


def _kind(name: str) -> str:
    if ".old-" in name:
        return "old package dir"
    return "index temp" if name.startswith(".index.json") else "package temp dir"


class _RepoPhase:
    """Where a `package build --repo` was killed, told by the temp names it left behind."""

    def __init__(self, repo: Path) -> None:
        self.repo, self.before = repo, set[str]()

    def prepare(self, _i: int) -> None:
        self.before = _leftovers(self.repo)

    def __call__(self, _log: Path) -> str:
        new = sorted({_kind(Path(n).name) for n in _leftovers(self.repo) - self.before})
        return "left " + " + ".join(new) if new else "left no temp"


@contextmanager
def repo_scene(base: Path, *, padding: int = 48 << 20) -> Iterator[Storm]:
    """`padding` bytes (appended to libcuda) make writing the package a visible part of a
    run, as against the interpreter's start-up."""
    tree = standin_tree(base / "tree", build_standins(base / "built"), VERSION)
    cuda = next(tree.rglob(f"libcuda.so.{VERSION}"))
    _padded(cuda, cuda.with_name("padded"), padding).replace(cuda)
    modules = {(k, v): stand_in_modules(base / "modules" / f"{k}-{v}", k, v)
               for k in REPO_KERNELS for v in "ab"}
    repo = base / "repo"
    choices = random.Random(7)
    plan = [choices.choice(sorted(modules)) for _ in range(4096)]

    def publish(kernel: str, variant: str) -> list[str]:
        return cli("package", "build", "--tree", str(tree), "--modules",
                   str(modules[kernel, variant]), "--repo", str(repo), "--alias", "default",
                   "--force")

    phase = _RepoPhase(repo)
    yield Storm("package build --repo", lambda i: publish(*plan[i % len(plan)]), _env(base),
                lambda: check_repo(repo), lambda: check_repo(repo, quiescent=True),
                prepare=phase.prepare, phase=phase,
                finals=tuple(publish(kernel, "a") for kernel in REPO_KERNELS))
