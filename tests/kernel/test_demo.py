"""The README's first command, `make demo` (scripts/demo.py), runs to a successful `status`
(real kernel)."""

from __future__ import annotations

import subprocess
import sys

from .assets import Kernel
from .conftest import REPO


def test_demo_installs_end_to_end(kernel: Kernel) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py")],
                          capture_output=True, text=True, timeout=900, check=False)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "no GPU here: NVML simulated" in out
    assert "full install" in out and "fast path (nothing downloaded or copied)" in out
    assert "/dev/nvidiactl" in out and "/dev/nvidia-uvm" in out
    assert f"Kernel:          {kernel.release}" in out
    assert "Ready:           yes: driver 535.261.03" in out
    # the node agent's first round: no NVSwitch, no persistenced in this package
    assert "gpu-node-installer agent --once" in out
    assert "ready (Ready): driver ready; no daemons needed" in out
    assert "changed=False" in out  # the second run reloads nothing
    # the package came from the product compiling sources against the headers .debs
    assert "$ gpu-node-installer package build --nvidia-source standin-source" in out
    assert "--kernel-headers linux-kbuild-" in out
    assert f"built 535.261.03 open for {kernel.release}" in out
