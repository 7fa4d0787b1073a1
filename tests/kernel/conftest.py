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


# Files whose assets take longest to make cold run last, in this order, so that the
# prefetch `make test` starts (tests/prefetch.py) has them ready: the matrix builds, trixie's
# build root and kernel, then everything arm64 (its emulated root, the cross-built 535).
LATE = ("test_matrix_real.py", "test_buildroot_real.py", "test_cross_arm64_real.py",
        "test_arm64_demo.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/kernel is the slow tier: `-m 'not kernel'` leaves it out. Its
    files keep their order but for LATE, moved to its end (the other tiers stay in place)."""
    places = [n for n, item in enumerate(items)
              if HERE in Path(str(item.fspath)).resolve().parents]
    for n in places:
        items[n].add_marker(pytest.mark.kernel)

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return LATE.index(name) + 1 if name in LATE else 0

    ordered = sorted((items[n] for n in places), key=rank)
    for n, item in zip(places, ordered, strict=True):
        items[n] = item


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
