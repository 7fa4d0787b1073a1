"""scripts/gpu-smoke.sh over the C stand-ins: the script a GPU VM's CI runs, minus the GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from native import build_standins

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-smoke.sh"


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standins(tmp_path_factory.mktemp("smoke-libs"))


def smoke(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    clean["PYTHON"] = sys.executable  # the interpreter running the tests has the deps
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**clean, **env})


def test_one_line_per_gpu(standins: Path, tmp_path: Path) -> None:
    readings = tmp_path / "readings"
    readings.write_text("sm_active=42.5 sm_occupancy=10 tensor_active=3 dram_active=7 "
                        "graphics_active=55\n"
                        "gpm=unsupported\n")
    done = smoke("--lib-dir", str(standins), "--expect-gpus", "2", FAKE_NVML_GPUS="2",
                 FAKE_CUDA_DEVICES="2", FAKE_NVML_METRICS_FILE=str(readings),
                 FAKE_NVML_BUS_IDS="00000000:10:00.0,00000000:11:00.0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 7
    assert lines[1].startswith("GPU 1 00000000:11:00.0 NVIDIA A100-SXM4-40GB GPU-")
    assert lines[1].endswith("driver 535.261.03 CUDA 12.2 vector-add ok")
    assert lines[2].startswith("agent view: fabric 2 GPUs")
    assert lines[3] == ("GPM GPU 0: sm_active 42.5% sm_occupancy 10.0% tensor_active 3.0% "
                        "dram_active 7.0% graphics_active 55.0%")
    assert lines[4] == "GPM GPU 1: not supported (the GPU has no GPM (Hopper and later have it))"
    assert lines[5] == "MIG GPU 0: NVML lists no MIG profiles; table: A100-40GB"


def test_the_agent_view_reports_fabric_and_persistence(standins: Path, tmp_path: Path) -> None:
    """An 8-GPU NVSwitch node mid-training of its fabric, persistence on for all."""
    fabric, persistence = tmp_path / "fabric", tmp_path / "persistence"
    fabric.write_text("3 0\n" * 6 + "2 0\n" * 2)
    persistence.write_text("1\n")
    done = smoke("--lib-dir", str(standins), "--expect-gpus", "8", FAKE_NVML_GPUS="8",
                 FAKE_CUDA_DEVICES="8", FAKE_NVML_FABRIC_FILE=str(fabric),
                 FAKE_NVML_PERSISTENCE_FILE=str(persistence))
    assert done.returncode == 0, done.stderr
    last = [line for line in done.stdout.splitlines() if line.startswith("agent view")][-1]
    assert last == ("agent view: fabric 8 GPUs: 6 completed, 2 in-progress; "
                    "persistence mode on for 8 of 8 GPUs"), last


def test_failure_keeps_verify_exit_code_and_says_why(standins: Path) -> None:
    done = smoke("--lib-dir", str(standins), "--expect-gpus", "1", FAKE_NVML_INIT_ERROR="9")
    assert done.returncode == 12
    assert "NVIDIA kernel module not loaded" in done.stderr
    assert done.stdout == ""


def test_directory_without_the_libraries(tmp_path: Path) -> None:
    done = smoke("--lib-dir", str(tmp_path))
    assert done.returncode == 12
    assert f"gpu-smoke: {tmp_path} lacks libnvidia-ml.so.1 or libcuda.so.1" in done.stderr


A100_40 = ("1g.5gb x7", "1g.10gb x4", "2g.10gb x3", "3g.20gb x2", "4g.20gb x1", "7g.40gb x1")


def test_mig_profiles_from_nvml_are_compared_with_the_table(standins: Path,
                                                            tmp_path: Path) -> None:
    """A driver that answers MIG profiles (the stand-in answers as R535 does: with MIG on):
    the line names them as the partition plans them and says whether the installer's table
    agrees; a board offering another count differs. The MIG mode is left as it was."""
    mig = tmp_path / "mig"
    mig.mkdir()
    (mig / "gpu0").write_text("mode 1 1\n")
    done = smoke("--lib-dir", str(standins), "--expect-gpus", "1", FAKE_NVML_GPUS="1",
                 FAKE_CUDA_DEVICES="1", FAKE_NVML_MIG_DIR=str(mig))
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    assert line.startswith("MIG GPU 0: A100-40GB from NVML: "), line
    assert line.endswith("; table agrees"), line
    for size in A100_40:
        assert size in line, (size, line)
    differs = smoke("--lib-dir", str(standins), "--expect-gpus", "1", FAKE_NVML_GPUS="1",
                    FAKE_CUDA_DEVICES="1",
                    FAKE_NVML_MIG_DIR=str(mig), FAKE_NVML_MIG_PROFILES="0:6")
    assert differs.returncode == 0, differs.stderr
    line = differs.stdout.splitlines()[-1]
    assert "1g.5gb x6" in line.split("; table")[0], line
    assert "; table differs: " in line and "1g.5gb x7" in line.split("; table")[1], line
    assert (mig / "gpu0").read_text() == "mode 1 1\n"
