"""Fixtures of the real-kernel tier: a Debian kernel, modules built for it, a guest to run in.

Every test here boots that kernel under qemu (TCG). The tier skips only when qemu itself
cannot run, and says why; a failure to fetch or build an asset is an error, not a skip.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import assets, guest
from .assets import Kernel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/kernel is the slow tier: `-m 'not kernel'` leaves it out."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.kernel)


@pytest.fixture(scope="session")
def kernel() -> Kernel:
    """Debian bookworm's current kernel, extracted (not installed) with headers, cached."""
    reason = guest.qemu_unavailable_reason()
    if reason:
        pytest.skip(f"real-kernel tier needs qemu: {reason}")
    return assets.ensure_headers(assets.ensure_kernel(assets.kernel_release()))


@pytest.fixture(scope="session")
def test_modules(kernel: Kernel) -> dict[str, Path]:
    """The stand-in nvidia*.ko built for each test driver version, by version."""
    return {v: assets.build_test_modules(kernel, v) for v in assets.TEST_MODULE_VERSIONS}


@pytest.fixture(scope="session")
def nvidia_package(kernel: Kernel) -> Path:
    """The package `package build --nvidia-source` made from Debian's real 535.261.03 source
    and headers .debs (the CLI compiles them: minutes cold, cached by the inputs' digests)."""
    return assets.build_nvidia_cli(kernel)


@pytest.fixture(scope="session")
def nvidia_real(nvidia_package: Path) -> Path:
    """NVIDIA's real 535.261.03 proprietary modules: the compiled package's modules/."""
    return nvidia_package / "modules"


GuestRunner = Callable[..., guest.GuestResult]


@pytest.fixture
def run_guest(kernel: Kernel, tmp_path: Path) -> GuestRunner:
    """Boot the kernel and run a bash script inside; the repo is the cwd and on PYTHONPATH."""

    def runner(script: str, **kwargs: Any) -> guest.GuestResult:
        out = tmp_path / f"guest{len(list(tmp_path.glob('guest*')))}"
        out.mkdir()
        env = {"PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
        kwargs.setdefault("timeout", 240.0)
        return guest.run_in_guest(script, kernel=kernel, cwd=REPO, env=env, out_dir=out, **kwargs)

    return runner
