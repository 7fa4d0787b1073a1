"""Tier 4: a real NVIDIA GPU and driver (GPU VMs, the `device` machine). Opt in: -m gpu.

Skipped, with the reason, where this machine has no NVIDIA driver loaded.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-smoke.sh"


def test_gpu_smoke_script_on_the_real_driver() -> None:
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.skip("no NVIDIA kernel driver loaded on this machine (/proc/driver/nvidia)")
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    gpus = [line for line in lines if line.startswith("GPU ")]
    assert gpus and all(line.endswith("vector-add ok") for line in gpus), done.stdout
    gpm = [line for line in lines if line.startswith("GPM GPU ")]
    assert len(gpm) == len(gpus), done.stdout  # a reading or why none, per GPU
