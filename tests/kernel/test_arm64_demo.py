"""`make demo ARCH=arm64` (scripts/demo.py --arch arm64) on Debian's arm64 kernel under
qemu-system-aarch64 (TCG), one boot for all of it: the guest itself (aarch64, its kernel, the
arm64 root's python3, modules.dep, `detect` on a node with no GPU yet, a write to its root
that stays in the guest); NVIDIA's real nvidia.ko, cross-built for the guest's release,
loads and answers ENODEV (no GPU); then `install` from a mirror on the guest's 127.0.0.1
with Debian's arm64 user-mode files and the cross-built stand-in modules: device nodes,
staging, readiness; a second run takes the fast path; the agent and `status` agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

from . import arm64
from .conftest import REPO

# Cold: the rootfs, Debian's arm64 files and NVIDIA's real modules cross-compiled (minutes).
pytestmark = pytest.mark.timeout(3000)


@pytest.fixture(scope="module")
def demo_output() -> str:
    reason = arm64.qemu_unavailable_reason()
    if reason:
        pytest.skip(f"arm64 guest needs {reason}")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--arch", "arm64"],
                          capture_output=True, text=True, timeout=2700, check=False)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    return done.stdout


def test_the_guest_is_aarch64_runs_python_and_detects_no_gpu(demo_output: str) -> None:
    release = arm64.kernel_release()
    assert f"== the guest: aarch64, kernel {release}, python aarch64 3." in demo_output
    assert "modules.dep present" in demo_output
    before_gpu = demo_output.split("== NVIDIA's real 535 nvidia.ko", 1)[0]
    assert f"Kernel:          {release} (aarch64)" in before_gpu, before_gpu[-3000:]
    assert "no NVIDIA GPU on this node" in before_gpu
    rootfs = arm64.ensure_rootfs(arm64.ensure_kernel())
    assert not (rootfs / "usr" / "gni-demo-write-stays-in-guest").exists()


def test_real_nvidia_module_loads_and_answers_enodev(demo_output: str) -> None:
    release = arm64.kernel_release()
    assert f"real 535 nvidia.ko (cross-built for {release})" in demo_output
    assert "finit_module: ENODEV (No such device)" in demo_output, demo_output[-4000:]
    assert "NVRM" in demo_output  # the module's own word that it found no GPU


def test_standin_install_nodes_staging_readiness_then_fast_path(demo_output: str) -> None:
    release = arm64.kernel_release()
    out = demo_output
    assert f"built 535.261.03 open for {release} (aarch64)" in out
    assert "--arch aarch64" in out
    assert "full install" in out and "fast path (nothing downloaded or copied)" in out
    assert "/dev/nvidiactl" in out and "/dev/nvidia-uvm" in out
    assert f"Kernel:          {release} (aarch64)" in out, out[-4000:]
    assert "Ready:           yes: driver 535.261.03" in out
    assert "ready (Ready): driver ready; no daemons needed" in out
    assert "changed=False" in out  # the second run reloads nothing
