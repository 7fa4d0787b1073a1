"""The arm64 guest itself: Debian's arm64 kernel boots under qemu-system-aarch64 (TCG), its
arm64 root runs python3, and the product, installed from its wheel, sees an aarch64 node."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import arm64
from .assets import Kernel


@pytest.fixture(scope="module")
def arm64_kernel() -> Kernel:
    """bookworm's linux-image-arm64, extracted and cached (skips only without qemu)."""
    reason = arm64.qemu_unavailable_reason()
    if reason:
        pytest.skip(f"arm64 guest needs {reason}")
    arm64.ensure_all()
    return arm64.ensure_kernel()


def test_arm64_guest_boots_runs_python_and_detects_aarch64(
    arm64_kernel: Kernel, tmp_path: Path
) -> None:
    script = """
    uname -m > "$GNI_OUT/machine"
    uname -r > "$GNI_OUT/release"
    python3 -c 'import platform, sys; print(platform.machine(), sys.version_info[:2])' \
        > "$GNI_OUT/python"
    test -f "/lib/modules/$(uname -r)/modules.dep" && echo yes > "$GNI_OUT/modules_dep"
    touch /usr/gni-arm64-write-stays-in-guest
    python3 -m installer detect --host-root / --proc-root /proc --sys-root /sys \
        --log-format console
    """
    result = arm64.run_in_guest(script, kernel=arm64_kernel, out_dir=tmp_path, timeout=600)
    assert result.rc == 0, result.describe()
    assert (tmp_path / "machine").read_text().strip() == "aarch64"
    assert (tmp_path / "release").read_text().strip() == arm64_kernel.release
    assert (tmp_path / "python").read_text().startswith("aarch64 (3, "), result.describe()
    assert (tmp_path / "modules_dep").read_text().strip() == "yes"
    assert f"Kernel:          {arm64_kernel.release} (aarch64)" in result.stdout, result.describe()
    assert "no NVIDIA GPU on this node" in result.stdout
    rootfs = arm64.ensure_rootfs(arm64_kernel)
    assert not (rootfs / "usr" / "gni-arm64-write-stays-in-guest").exists()
    print(f"arm64 guest: boot + python + detect in {result.wall_s:.1f}s")
