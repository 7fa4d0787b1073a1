"""NVIDIA's real nvidia-peermem (Debian's nvidia-kernel-source 535) rebuilt alone by the
installer's on-node builder (`packages.builder.peermem`) against Debian 6.1's real headers
and an OFED tree: NVIDIA's own Kbuild and conftest.sh decide, from that tree's
Module.symvers, to compile the peer-memory client in, and modpost records OFED's CRCs for
it and the real nvidia.ko's CRCs for nvidia_p2p_* (given as KBUILD_EXTRA_SYMBOLS). Without
an OFED tree the same sources build the stub that imports no peer-memory symbol (what the
load stage refuses as PeerMemoryApiUnused on an OFED node). No boot: the module is read,
not loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from installer.cli import logs
from installer.node import kmod, modversions
from installer.packages.builder.peermem import PeermemRequest, build_peermem
from installer.packages.manifest import Package
from installer.packages.tree import read_tree
from installer.testing.kernel import write_package

from . import assets
from .assets import Kernel

pytestmark = pytest.mark.timeout(1200)
OFED = {"ib_register_peer_memory_client": 0x11111111,
        "ib_unregister_peer_memory_client": 0x22222222}


@pytest.fixture(scope="module")
def source_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """Debian's real nvidia-kernel-source tree as a source package's kernel-source/."""
    work = tmp_path_factory.mktemp("nvsource")
    subprocess.run(["dpkg-deb", "-x", str(assets.nvidia_source_deb()), str(work / "deb")],
                   check=True)
    (work / "src").mkdir()
    subprocess.run(["tar", "-xJf", str(work / "deb/usr/src/nvidia-kernel.tar.xz"), "-C",
                    str(work / "src")], check=True)
    tree = work / "src/modules/nvidia-kernel"
    files = {f"kernel-source/{p.relative_to(tree).as_posix()}": (p.read_bytes(), "source")
             for p in sorted(tree.rglob("*")) if p.is_file() and "debian" not in p.parts}
    return write_package(work / "package", [], driver_version="535.261.03",
                         kernel_release="source", extra_files=files)


def _nvidia_exports(nvidia_package: Path) -> dict[str, int]:
    package = read_tree(nvidia_package)
    entry = next(m for m in package.manifest.modules if m.name == "nvidia")
    return modversions.exported(package.path_of(entry.file).read_bytes())


def _build(tmp: Path, source: Package, kernel: Kernel, ofed: Path | None,
           exports: dict[str, int]) -> bytes:
    symvers = tmp / "nvidia.symvers"
    symvers.write_text(modversions.symvers_text(exports, "nvidia"))
    (tmp / "work").mkdir()
    built = build_peermem(PeermemRequest(source, kernel.headers, ofed, nvidia_symvers=symvers),
                          tmp / "work", logs.get_logger())
    return built.read_bytes()


def test_real_peermem_is_built_against_ofeds_crcs_and_the_real_nvidias(
        tmp_path: Path, kernel: Kernel, nvidia_package: Path,
        source_package: Package) -> None:
    ofed = tmp_path / "ofa_kernel/x86_64" / kernel.release
    (ofed / "include").mkdir(parents=True)
    (ofed / "Module.symvers").write_text(modversions.symvers_text(OFED, "drivers/infiniband/"
                                                                  "core/ib_core"))
    exports = _nvidia_exports(nvidia_package)
    data = _build(tmp_path, source_package, kernel, ofed, exports)
    recorded = modversions.recorded(data)
    assert {name: recorded.get(name) for name in OFED} == OFED
    p2p = {name for name in recorded if name.startswith("nvidia_p2p_")}
    assert "nvidia_p2p_get_pages" in p2p
    assert all(recorded[name] == exports[name] for name in p2p)
    assert sorted(kmod.modinfo_depends(data)) == ["ib_core", "nvidia"]


def test_without_ofed_the_real_sources_build_the_stub(
        tmp_path: Path, kernel: Kernel, nvidia_package: Path,
        source_package: Package) -> None:
    data = _build(tmp_path, source_package, kernel, None, _nvidia_exports(nvidia_package))
    recorded = modversions.recorded(data)
    assert not any(name in recorded for name in OFED)
