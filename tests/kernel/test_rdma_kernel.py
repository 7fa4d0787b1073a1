"""nvidia-peermem on a real kernel: Debian's inbox ib_core loaded in the guest, a
peermem-shaped module built against the kernel's real headers (tests/kernel/peermem) loaded
by the load stage after the stand-in nvidia; a copy with one recorded CRC changed refused
before loading with both CRCs named, the GPUs' modules kept, and the kernel refusing the
same copy on its own ("disagrees about version of symbol"); then, a rebuild allowed, the
same package's peermem compiled in the guest by the installer's builder against the running
kernel's headers (tests/kernel/peermem_source, NVIDIA's Kbuild shape), checked and loaded."""

from __future__ import annotations

import errno
import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from . import assets, guest
from .apt import log, run
from .assets import Kernel
from .conftest import HERE, REPO

pytestmark = pytest.mark.timeout(1200)
VERSION = "535.261.03"
SOURCES = (assets.MODULES_SRC / "nvidia.c", assets.MODULES_SRC / "nvidia-uvm.c",
           HERE / "peermem" / "nvidia-peermem.c")


def build_peermem_set(kernel: Kernel) -> Path:
    """nvidia, nvidia-uvm and the peermem stand-in, built together (modpost resolves the
    stand-in nvidia's symbol and the kernel's ib_core from its Module.symvers); cached."""
    assets.ensure_headers(kernel)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:12]
    out = kernel.root / "test-modules" / f"peermem-{VERSION}-{digest}"
    with assets.locked(f"test-modules-{kernel.release}-peermem"):
        if out.is_dir():
            return out
        assets.check_toolchain(kernel)
        log("building the peermem test modules")
        with assets.staging(out) as tmp:
            build = tmp / "build"
            build.mkdir()
            for source in SOURCES:
                shutil.copy2(source, build / source.name)
            (build / "Kbuild").write_text(
                f'ccflags-y += -DNV_VERSION_STRING=\\"{VERSION}\\"\n'
                "obj-m := nvidia.o nvidia-uvm.o nvidia-peermem.o\n")
            run(["make", "-C", str(kernel.headers), f"M={build}", "-j2", "modules"],
                env=assets.build_env())
            for ko in build.glob("*.ko"):
                shutil.copy2(ko, tmp / ko.name)
            shutil.rmtree(build)
    return out


@pytest.fixture(scope="module")
def guest_run(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    ko = build_peermem_set(kernel)
    out = tmp_path_factory.mktemp("guest-rdma")
    script = (f'"{sys.executable}" tests/kernel/rdma_guest.py "{ko}" "$GNI_OUT" '
              f'"{kernel.headers}"\n')
    result = guest.run_in_guest(script, kernel=kernel, cwd=REPO, timeout=500,
                                env={"PYTHONPATH": str(REPO)}, out_dir=out)
    assert result.rc == 0, result.describe()
    data: dict[str, object] = result.json("results.json")
    return data


def test_the_real_ib_cores_crcs_are_read_from_its_loaded_file(
        guest_run: dict[str, object]) -> None:
    stack = guest_run["stack"]
    assert isinstance(stack, dict)
    assert stack["ib_core_loaded"] is True and stack["kind"] == "inbox"
    assert str(guest_run["source"]).endswith("kernel/drivers/infiniband/core/ib_core.ko")
    assert stack["srcversion"] is None and guest_run["build_id_note"] is True  # by build ID
    assert guest_run["exported"] == guest_run["recorded"]
    depends = guest_run["depends"]
    assert isinstance(depends, list) and sorted(depends) == ["ib_core", "nvidia"]


def test_peermem_loads_after_nvidia(guest_run: dict[str, object]) -> None:
    match = guest_run["match"]
    assert isinstance(match, dict)
    verdict = match["verdict"]
    assert verdict["ready"] is True and verdict["reason"] == "PeermemLoaded", verdict
    assert match["loaded"] == ["nvidia", "nvidia_uvm", "nvidia_peermem"]
    assert {"ib_core", "nvidia", "nvidia_uvm", "nvidia_peermem"} <= set(match["modules"])
    assert guest_run["ib_core_holders"] == ["nvidia_peermem"]


def test_a_changed_crc_is_refused_before_loading_and_the_gpus_stay(
        guest_run: dict[str, object]) -> None:
    patched = guest_run["patched"]
    assert isinstance(patched, dict)
    verdict = patched["verdict"]
    assert verdict["ready"] is False and verdict["reason"] == "SymbolVersionMismatch"
    recorded = guest_run["recorded"]
    assert isinstance(recorded, int)
    message = verdict["message"]
    assert f"ib_register_client has CRC {recorded ^ 1:#010x}" in message
    assert f"exports {recorded:#010x}" in message and "inbox ib_core" in message
    assert patched["warnings"] == [message]
    assert "nvidia_peermem" not in patched["modules"]
    assert {"nvidia", "nvidia_uvm"} <= set(patched["modules"]) and patched["nvidiactl"]
    assert patched["kept"] == ["nvidia", "nvidia_uvm"]
    # the kernel agrees: the same copy, loaded by hand, is refused for that symbol
    assert guest_run["kernel_errno"] == errno.EINVAL
    disagrees = guest_run["disagrees"]
    assert isinstance(disagrees, list)
    assert any("nvidia_peermem: disagrees about version of symbol ib_register_client" in line
               for line in disagrees), disagrees


def test_the_refused_peermem_is_rebuilt_in_the_guest_and_loads(
        guest_run: dict[str, object]) -> None:
    rebuilt = guest_run["rebuilt"]
    assert isinstance(rebuilt, dict)
    verdict = rebuilt["verdict"]
    assert verdict["ready"] is True and verdict["reason"] == "PeermemRebuilt", verdict
    assert "rebuilt on the node" in verdict["message"] and "inbox ib_core" in verdict["message"]
    recorded = guest_run["recorded"]
    assert isinstance(recorded, int)
    assert f"CRC {recorded ^ 1:#010x}" in verdict["message"]  # the package's, named
    assert guest_run["rebuilt_recorded"] == guest_run["exported"]
    exports = guest_run["nvidia_exports"]  # built alone, versioned against the loaded nvidia
    assert isinstance(exports, dict)
    assert guest_run["rebuilt_nvidia_crc"] == exports["nvgni_core_version"]
    assert "nvidia_peermem" in rebuilt["loaded"] and rebuilt["warnings"] == []
    assert {"ib_core", "nvidia", "nvidia_uvm", "nvidia_peermem"} <= set(rebuilt["modules"])
