"""The MIG-config arena the adversarial MIG suites share: an 8-GPU A100 node with the
driver installed once per module (the real CLI, `tests/fakenode_gpus.py`), copied into each
case's arena, and `partition` run sandboxed with the checks a refused run must pass.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import INSTALL_DIR, NODE, Scene, add_version, standin_env

from adversarial.harness import (
    KERNEL_STATE,
    SANDBOX_FAILED,
    Arena,
    Result,
    assert_refused,
    assert_untouched,
    sandboxed,
)
from installer.testing import SAMPLE_NODES, PciSpec, build_node

V = "535.261.03"
A100 = ("NVIDIA A100-SXM4-40GB", 40960, 0x20B0)
GPUS = 8
A100_SIZES = "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"
FAKENODE_GPUS = Path(__file__).resolve().parents[1] / "fakenode_gpus.py"
TIMEOUT = 20  # seconds per refused run (a Python start in the sandbox, on a loaded machine)
# What a refused `partition` may change: the readiness it withdraws (the node is not as
# configured: the held copy the agent would publish goes too), the installer's own work
# area, the simulated kernel's and the NVML stand-in's bookkeeping (its lock; a GPU's MIG
# state is checked on its own).
WITHDRAWN = (f"node/{INSTALL_DIR}/.ready.json", "node/run/nvidia/validations/",
             f"node/{INSTALL_DIR}/.agent/ready.json",
             f"node/{INSTALL_DIR}/.agent/driver-ready.env",
             f"node/{INSTALL_DIR}/.lock", f"node/{INSTALL_DIR}/.cache/tmp", KERNEL_STATE,
             "mig/lock")


def _addresses() -> list[str]:
    return [f"0000:{0x10 + i:02x}:00.0" for i in range(GPUS)]


def _env(base: Path) -> dict[str, str]:
    name, memory, _ = A100
    env = {**standin_env(V, GPUS), "FAKE_NVML_NAMES": ",".join([name] * GPUS),
           "FAKE_NVML_MEMORY_MIB": ",".join([str(memory)] * GPUS),
           "FAKE_NVML_BUS_IDS": ",".join(f"0000{a}" for a in _addresses()),
           "FAKE_NVML_MIG_DIR": str(base / "mig"),
           "FAKE_NVML_PROC_DIR": str(base / "node" / "proc"), "FAKE_KERNEL_GPUS": str(GPUS)}
    from installer.config import SETTINGS

    for setting in SETTINGS:
        if setting.envvar:
            env.pop(setting.envvar, None)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An 8-GPU A100 node with the driver installed (MIG not configured yet)."""
    base = tmp_path_factory.mktemp("mig-template")
    _, _, device = A100
    spec = dataclasses.replace(SAMPLE_NODES[NODE], pci=tuple(
        PciSpec(a, device, 0x030200, driver=None) for a in _addresses()))
    (base / "node").mkdir()
    build_node(base / "node", spec)
    scene = Scene(base / "node", base / "repo", base / "work")
    scene.work.mkdir()
    add_version(scene, V)
    (base / "mig").mkdir()
    done = subprocess.run(
        [sys.executable, str(FAKENODE_GPUS), "install",
         *scene.args("--mirror", f"file://{scene.repo}", "--driver-version", V)],
        capture_output=True, text=True, env=_env(base), timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.rmtree(scene.work)
    yield base


@pytest.fixture
def node(installed: Path, tmp_path: Path) -> Arena:
    """A copy of the installed node in this case's arena, with sentinels outside it."""
    base = tmp_path / "arena"
    shutil.copytree(installed, base, symlinks=True)
    scene = Scene(base / "node", base / "repo", base / "work")
    scene.work.mkdir()
    outside = base / "outside"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "sentinel.conf").write_text("not the installer's\n")
    return Arena(base, scene, outside, _env(base))


def _run(arena: Arena, *args: str) -> Result:
    """`fakenode_gpus.py ARGS` (a simulated kernel with 8 GPUs) in the suite's sandbox:
    every filesystem but the arena read-only (`adversarial.harness.SANDBOX`)."""
    done = subprocess.run(sandboxed(arena.base, sys.executable, str(FAKENODE_GPUS), *args),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env=arena.run_env(), check=False, errors="replace")
    assert done.returncode != SANDBOX_FAILED, f"sandbox not set up: {done.stderr[-500:]}"
    return Result(done.returncode, done.stdout, done.stderr)


def _partition(arena: Arena, config: str, name: str, *extra: str) -> Result:
    path = arena.scene.work / "mig.yaml"
    path.write_text(config)
    return _run(arena, "partition", *arena.args("--output", "json", "--mig-config-file",
                                                str(path), "--mig-config", name, *extra))


def _config(entry: str) -> str:
    return f"version: v1\nmig-configs:\n  case:\n{entry}"


def _refused(arena: Arena, config: str, *causes: str, dry_run: bool = False) -> None:
    (arena.scene.work / "mig.yaml").write_text(config)
    before = arena.snapshot()
    done = _partition(arena, config, "case", *(("--dry-run",) if dry_run else ()))
    assert_refused(done, 2, "error(config): [partition] ", *causes)
    assert json.loads(done.stdout)["error"] == done.lines[0]  # -o json: the failure object
    assert not any((arena.base / "mig").glob("gpu*")), "a GPU's MIG state changed"
    assert_untouched(before, arena.snapshot(), WITHDRAWN)
