"""gdrdrv on a real kernel: `package build --gdrcopy` compiles the stated gdrdrv-shaped fixture
(tests/gdrsources.py; GDRCopy is in neither Debian's nor PyPI's archives) with the stand-in
NVIDIA sources against the tier kernel's real headers; in the guest the load stage loads the
driver, then gdrdrv over the stand-in nvidia, and makes /dev/gdrdrv with the major the kernel
registered for "gdrdrv", minor 0. One boot."""

from __future__ import annotations

import sys

import pytest
from gdrsources import GDR_VERSION, gdrcopy_fixture
from nvsources import mini_source

from installer.packages.builder import BuildRequest, build

from . import assets, guest
from .assets import Kernel
from .conftest import REPO

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def guest_run(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("gdrdrv")
    debs = assets.release_headers_debs(kernel.release)
    result = build(BuildRequest(nvidia_source=mini_source(work / "nv"),
                                kernel_headers=tuple(debs),
                                gdrcopy=gdrcopy_fixture(work / "gdrcopy"),
                                output=work / "pkg"))
    assert [m.name for m in result.manifest.optional_modules] == ["gdrdrv"]
    out = tmp_path_factory.mktemp("guest-gdrdrv")
    script = f'"{sys.executable}" tests/kernel/gdrdrv_guest.py "{work / "pkg"}" "$GNI_OUT"\n'
    run = guest.run_in_guest(script, kernel=kernel, cwd=REPO, timeout=400,
                             env={"PYTHONPATH": str(REPO)}, out_dir=out)
    assert run.rc == 0, run.describe()
    data: dict[str, object] = run.json("results.json")
    return data


def test_gdrdrv_loads_over_the_stand_in_nvidia(guest_run: dict[str, object]) -> None:
    loaded = guest_run["loaded"]
    assert isinstance(loaded, list)
    assert loaded.index("gdrdrv") > loaded.index("nvidia"), loaded
    (verdict,) = guest_run["optional"]  # type: ignore[misc]
    assert verdict["ready"] is True and verdict["reason"] == "Loaded", verdict
    holders = guest_run["nvidia_holders"]
    assert isinstance(holders, list) and "gdrdrv" in holders
    assert guest_run["gdrdrv_version"] == GDR_VERSION
    assert guest_run["warnings"] == []


def test_its_node_has_the_registered_major_and_minor_0(guest_run: dict[str, object]) -> None:
    majors = guest_run["majors"]
    assert isinstance(majors, dict)
    assert guest_run["node"] == {"char": True, "major": majors["gdrdrv"], "minor": 0,
                                 "mode": 0o666}
    assert guest_run["opened"] is True

