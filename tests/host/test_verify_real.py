"""NVIDIA's real 535 libnvidia-ml and libcuda on a machine with no NVIDIA kernel driver.

Run as root these libraries `mknod /dev/nvidiactl`, so they run only inside a private mount
namespace whose /dev is a fresh tmpfs: the machine's own /dev is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import artifacts
import pytest
from native.contexts import make_ctx, node_args
from native.packages import tree_package

from installer.stages import stage
from installer.testing import SAMPLE_NODES, build_node

VERSION = "535.261.03"
INSTALL = "home/kubernetes/bin/nvidia"
REPO = Path(__file__).resolve().parents[2]
PRIVATE_DEV = "mount -t tmpfs gni-dev /dev && mknod -m 666 /dev/null c 1 3 && exec "


def _namespace_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make a private mount namespace with its own /dev"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"this kernel/container refuses mount namespaces: {probe.stderr.strip()}"
    return None


def in_private_dev(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command with a throw-away /dev (and nothing else changed)."""
    command = PRIVATE_DEV + " ".join(f"'{a}'" for a in argv)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _namespace_unavailable()
    if reason:
        pytest.skip(reason)
    root = build_node(tmp_path_factory.mktemp("real") / "node", SAMPLE_NODES["debian12-l4"])
    stage.stage_package(make_ctx(root), tree_package(artifacts.nvidia_tree(VERSION), VERSION))
    return root


def test_signal_with_real_nvml_and_no_kernel_module_fails_and_writes_no_readiness(
        real_node: Path) -> None:
    ready = real_node / INSTALL / ".ready.json"
    env_file = real_node / "run/nvidia/validations/driver-ready"
    for stale in (ready, env_file):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("stale from an earlier boot\n")
    done = in_private_dev([sys.executable, "-m", "installer", "signal", *node_args(real_node),
                           "--log-format", "json", "--termination-log", "/dev/null"])
    assert done.returncode == 12, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error(verification-failed): [verify] NVIDIA kernel module not "
                           "loaded (nvmlInit, NVML error 9)"), line
    assert not ready.exists() and not env_file.exists()
    assert not Path("/dev/nvidiactl").exists()


def test_real_libcuda_without_a_driver_reports_no_device(real_node: Path) -> None:
    libcuda = real_node / INSTALL / "lib64" / "libcuda.so.1"
    code = ("import sys; from pathlib import Path; from installer.stages.verify import cuda\n"
            "try:\n cuda.check_driver(Path(sys.argv[1]), smoke=False)\n"
            "except cuda.CudaError as e:\n print(e.message)")
    done = in_private_dev([sys.executable, "-c", code, str(libcuda)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA "
                                   "device visible: kernel module not loaded, /dev/nvidia* "
                                   "missing, or hidden by CUDA_VISIBLE_DEVICES")
