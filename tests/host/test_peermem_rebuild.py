"""nvidia-peermem rebuilt on the node (BUILD_FALLBACK=auto) when the package's does not fit
the loaded ib_core, over host trees with the simulated kernel.

Two parts. The load stage's decision through its `rebuild` seam (a callable that returns a
module or raises): rebuilt and loaded, a failing rebuild (GPUs stay ready, the condition
names the compiler's line), a rebuild that still does not fit. And the real compile
(`installer.stages.load.rebuild` -> `packages.builder.peermem`): Debian's real headers
under the host root (tests/fallbacknode.py), an NVIDIA-shaped peermem tree
(tests/kernel/peermem_source: NVIDIA's OFED lookup verbatim) in a source package in the host
cache, and an OFED tree under /usr/src/ofa_kernel whose Module.symvers carries the loaded
ib_core's CRCs: make and gcc-12 really build it, modpost records OFED's CRC, the check
passes, the module loads.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest
from fallbacknode import RELEASE as DEBIAN_RELEASE
from fallbacknode import make_node

from installer.cli import logs
from installer.config import load_config
from installer.context import Context
from installer.node import modversions
from installer.node.host import Roots
from installer.node.rdma import RdmaStack, RdmaVerdict, RebuildFailed
from installer.packages.cache import Cache
from installer.packages.manifest import SOURCE_RELEASE, Package
from installer.stages import load
from installer.stages.load import rebuild
from installer.testing import SAMPLE_NODES, IbSpec, build_node, nic_vpd
from installer.testing.kernel import (
    FakeKernelHost,
    fake_module_set,
    module_file_bytes,
    write_host_module,
    write_package,
)

VERSION = "535.261.03"
PEER, UNPEER = "ib_register_peer_memory_client", "ib_unregister_peer_memory_client"
OFED = {PEER: 0x11111111, UNPEER: 0x22222222}
BAD = 0x0BAD0BAD
OFED_CORE = "updates/dkms/ib_core.ko"
STANDIN = Path(__file__).resolve().parents[1] / "kernel" / "peermem_source"


def _ofed_node(root: Path, release: str) -> FakeKernelHost:
    """MLNX_OFED's ib_core (exporting the peer-memory API) loaded, its tree in /usr/src."""
    host = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
    tree = root / "lib/modules" / release
    write_host_module(tree, OFED_CORE, "ib_core", exports=OFED,
                      srcversion="0FED0FED0FED0FED0FED0FE")
    with (tree / "modules.dep").open("a") as handle:
        handle.write(f"{OFED_CORE}:\n")
    ofed = root / "usr/src/ofa_kernel/x86_64" / release
    (ofed / "include/rdma").mkdir(parents=True)
    (ofed / "include/rdma/peer_mem.h").write_text(
        "/* OFED's peer-memory client API (MLNX_OFED include/rdma/peer_mem.h), reduced */\n"
        "struct peer_memory_client { const char *name; };\n"
        "void *ib_register_peer_memory_client(const struct peer_memory_client *client,\n"
        "                                     void *invalidate_callback);\n"
        "void ib_unregister_peer_memory_client(void *reg_handle);\n")
    (ofed / "Module.symvers").write_text("".join(
        f"{crc:#010x}\t{name}\tdrivers/infiniband/core/ib_core\tEXPORT_SYMBOL\t\n"
        for name, crc in OFED.items()))
    host.finit_module(tree / OFED_CORE, "")
    (root / "sys/module/ib_core/version").write_text("24.10-1.1.4\n")
    return host


NV_EXPORT = {"nvgni_core_version": 0x5EED5EED}  # the stand-in nvidia's, as peermem's p2p


def _package(base: Path, versions: dict[str, int] | None, flavour: str = "proprietary"
             ) -> Package:
    modules = fake_module_set(base / "ko", VERSION)
    modules[0].source.write_bytes(module_file_bytes("nvidia", VERSION, exports=NV_EXPORT))
    extra = {"kernel/nvidia-peermem.ko": (module_file_bytes(
        "nvidia_peermem", VERSION, ["nvidia", "ib_core"], versions=versions), "module")} \
        if versions else None
    return write_package(base / "pkg", modules, driver_version=VERSION,
                         kernel_release=DEBIAN_RELEASE, flavour=flavour, extra_files=extra)


def _module(base: Path, name: str, versions: dict[str, int]) -> Path:
    path = base / name
    path.write_bytes(module_file_bytes("nvidia_peermem", VERSION, ["nvidia", "ib_core"],
                                       versions=versions))
    return path


def _gpus_kept(host: FakeKernelHost) -> None:
    assert host.version_of("nvidia") == VERSION and host.version_of("nvidia_uvm") == VERSION
    assert (host.roots.dev / "nvidiactl").exists()


class TestSeam:
    """The decision around a rebuild (a stand-in callable; the compile is tested below)."""

    @pytest.fixture
    def host(self, tmp_path: Path) -> FakeKernelHost:
        spec = dataclasses.replace(SAMPLE_NODES["gke-ubuntu-t4"], kernel=DEBIAN_RELEASE,
                                   infiniband=(IbSpec("mlx5_0", "0000:1a:00.0", nic_vpd()),))
        return _ofed_node(build_node(tmp_path / "node", spec), DEBIAN_RELEASE)

    def test_mismatch_is_rebuilt_checked_and_loaded(self, tmp_path: Path,
                                                   host: FakeKernelHost) -> None:
        asked: list[tuple[str, str]] = []

        def built(stack: RdmaStack, release: str) -> Path:
            asked.append((stack.kind, release))
            return _module(tmp_path, "rebuilt.ko", OFED)

        result = load.load_package(host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto",
                                   peermem_rebuild=built)
        assert asked == [("ofed", DEBIAN_RELEASE)]
        assert result.rdma is not None and result.rdma.ready, result.rdma
        assert result.rdma.reason == "PeermemRebuilt"
        assert "rebuilt on the node" in result.rdma.message
        assert "0x0bad0bad" in result.rdma.message and "0x11111111" in result.rdma.message
        assert "nvidia_peermem" in host.modules and "nvidia_peermem" in result.loaded
        assert result.warnings == []

    def test_failed_rebuild_keeps_the_gpus_and_names_the_compiler(
            self, tmp_path: Path, host: FakeKernelHost) -> None:
        def broken(stack: RdmaStack, release: str) -> Path:
            raise RebuildFailed("make exited 2: nvidia-peermem.c:12:1: error: expected ';'")

        result = load.load_package(host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto",
                                   peermem_rebuild=broken)
        assert result.rdma is not None and not result.rdma.ready
        assert result.rdma.reason == "PeermemRebuildFailed"
        message = result.rdma.message
        assert "error: expected ';'" in message and "\n" not in message
        assert "0x0bad0bad" in message and "0x11111111" in message
        assert message.endswith("the GPUs are ready without it")
        assert result.warnings == [message]
        _gpus_kept(host)
        assert "nvidia_peermem" not in host.modules

    def test_a_rebuild_raising_an_installer_error_is_a_failed_rebuild(
            self, tmp_path: Path, host: FakeKernelHost) -> None:
        from installer.packages.builder.peermem import PeermemBuildError

        def refused(stack: RdmaStack, release: str) -> Path:
            raise PeermemBuildError("make exited 2: ERROR: modpost: \"x\" undefined!")

        result = load.load_package(host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto",
                                   peermem_rebuild=refused)
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuildFailed"
        assert 'modpost: "x" undefined!' in result.rdma.message
        _gpus_kept(host)

    def test_a_rebuild_that_still_disagrees_is_refused(self, tmp_path: Path,
                                                      host: FakeKernelHost) -> None:
        result = load.load_package(
            host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto",
            peermem_rebuild=lambda s, r: _module(tmp_path, "wrong.ko", {PEER: 0x33333333}))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuildFailed"
        assert "rebuilt on the node" in result.rdma.message
        assert "0x33333333" in result.rdma.message
        _gpus_kept(host)
        assert "nvidia_peermem" not in host.modules

    def test_a_rebuild_without_the_peer_api_is_refused(self, tmp_path: Path,
                                                      host: FakeKernelHost) -> None:
        result = load.load_package(
            host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto",
            peermem_rebuild=lambda s, r: _module(tmp_path, "stub.ko", {}))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuildFailed"
        assert "without the peer-memory API" in result.rdma.message
        assert "nvidia_peermem" not in host.modules

    def test_a_stub_built_without_ofed_is_refused_then_rebuilt(
            self, tmp_path: Path, host: FakeKernelHost) -> None:
        """NVIDIA's peermem built where conftest found no OFED Module.symvers imports no
        peer-memory symbol and fails its init with EINVAL: refused before, rebuilt here."""
        stub = {"module_layout": 0x9060323F}
        refused = load.load_package(host, _package(tmp_path / "a", stub), rdma_mode="auto")
        assert refused.rdma is not None and refused.rdma.reason == "PeerMemoryApiUnused"
        assert "EINVAL" in refused.rdma.message and "BUILD_FALLBACK=auto" in \
            refused.rdma.message
        assert "nvidia_peermem" not in host.modules
        rebuilt = load.load_package(host, _package(tmp_path / "b", stub), rdma_mode="auto",
                                    peermem_rebuild=lambda s, r: _module(tmp_path, "r.ko", OFED))
        assert rebuilt.rdma is not None and rebuilt.rdma.reason == "PeermemRebuilt"
        assert "nvidia_peermem" in host.modules

    def test_a_package_without_peermem_is_rebuilt(self, tmp_path: Path,
                                                 host: FakeKernelHost) -> None:
        result = load.load_package(host, _package(tmp_path, None), rdma_mode="auto",
                                   peermem_rebuild=lambda s, r: _module(tmp_path, "n.ko", OFED))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuilt"
        assert "ships no nvidia-peermem" in result.rdma.message

    def test_without_the_fallback_the_mismatch_is_refused_naming_it(
            self, tmp_path: Path, host: FakeKernelHost) -> None:
        result = load.load_package(host, _package(tmp_path, {PEER: BAD}), rdma_mode="auto")
        assert result.rdma is not None and result.rdma.reason == "SymbolVersionMismatch"
        assert "BUILD_FALLBACK=auto" in result.rdma.message
        _gpus_kept(host)


def _source_package(base: Path, source: Path) -> Package:
    files = {f"kernel-source/{p.relative_to(source).as_posix()}": (p.read_bytes(), "source")
             for p in sorted(source.rglob("*")) if p.is_file()}
    return write_package(base, [], driver_version=VERSION, kernel_release=SOURCE_RELEASE,
                         extra_files=files)


def _cache_it(ctx: Context, package: Package) -> None:
    """Into the host cache, as the on-node build leaves the source package it fetched."""
    cache = Cache(ctx.install_root / ".cache")
    with cache.run():
        for entry in package.manifest.files:
            tmp = cache.temp_path("blob")
            shutil.copyfile(package.root / entry.path, tmp)
            cache.commit(tmp, entry.sha256)
        cache.record(package.manifest, (package.root / "manifest.json").read_bytes(), VERSION)


def _context(host: FakeKernelHost) -> Context:
    root = host.roots.host
    config = load_config({"host_root": str(root), "proc_root": str(root / "proc"),
                          "sys_root": str(root / "sys"), "dev_root": str(root / "dev"),
                          "build_fallback": "auto", "rdma": "on"}, {})
    return Context(config=config, host=host, log=logs.get_logger())


class TestRealCompile:
    """make and gcc-12 against Debian's real headers, OFED's tree, NVIDIA's Kbuild logic."""

    def _scene(self, tmp_path: Path, headers_root: Path, source: Path
               ) -> tuple[Context, FakeKernelHost, Package]:
        host = _ofed_node(make_node(tmp_path / "n", headers_root), DEBIAN_RELEASE)
        ctx = _context(host)
        _cache_it(ctx, _source_package(tmp_path / "source", source))
        package = _package(tmp_path, {PEER: BAD})
        ctx.package = package
        return ctx, host, package

    def test_rebuilt_against_ofed_loaded_and_cached(self, tmp_path: Path,
                                                   headers_root: Path) -> None:
        ctx, host, package = self._scene(tmp_path, headers_root, STANDIN)
        result = load.load_package(host, package, rdma_mode="on",
                                   peermem_rebuild=rebuild.rebuilder(ctx))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuilt", result.rdma
        assert "nvidia_peermem" in host.modules
        (kept,) = (ctx.install_root / ".cache" / rebuild.CACHE_DIR).glob("*.ko")
        recorded = modversions.recorded(kept.read_bytes())
        assert recorded[PEER] == OFED[PEER] and recorded[UNPEER] == OFED[UNPEER]
        # built alone, its import from nvidia is versioned with the package's nvidia's CRC
        assert recorded["nvgni_core_version"] == NV_EXPORT["nvgni_core_version"]
        # the next boot: the same inputs find the module built before, nothing compiles
        host.delete_module("nvidia_peermem")
        stamp = kept.stat().st_mtime_ns
        again = load.load_package(host, package, rdma_mode="on",
                                  peermem_rebuild=rebuild.rebuilder(ctx))
        assert again.rdma is not None and again.rdma.reason == "PeermemRebuilt"
        assert kept.stat().st_mtime_ns == stamp
        # a kept module whose bytes are not the recorded ones is never loaded: built anew
        host.delete_module("nvidia_peermem")
        kept.write_bytes(kept.read_bytes()[:-1] + b"X")
        third = load.load_package(host, package, rdma_mode="on",
                                  peermem_rebuild=rebuild.rebuilder(ctx))
        assert third.rdma is not None and third.rdma.reason == "PeermemRebuilt"
        assert modversions.recorded(kept.read_bytes())[PEER] == OFED[PEER]
        assert not kept.read_bytes().endswith(b"X")

    def test_compile_error_is_the_condition_and_the_gpus_stay(
            self, tmp_path: Path, headers_root: Path) -> None:
        broken = tmp_path / "broken"
        shutil.copytree(STANDIN, broken)
        c_file = broken / "nvidia-peermem/nvidia-peermem.c"
        c_file.write_text(c_file.read_text().replace("return gni_handle ? 0 : -EINVAL;",
                                                     "return gni_handle ? 0 : -EINVAL"))
        ctx, host, package = self._scene(tmp_path, headers_root, broken)
        result = load.load_package(host, package, rdma_mode="on",
                                   peermem_rebuild=rebuild.rebuilder(ctx))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuildFailed"
        assert "error: expected ';'" in result.rdma.message, result.rdma.message
        assert "0x0bad0bad" in result.rdma.message
        _gpus_kept(host)
        assert "nvidia_peermem" not in host.modules

    def test_no_source_package_names_the_fix(self, tmp_path: Path,
                                             headers_root: Path) -> None:
        host = _ofed_node(make_node(tmp_path / "n", headers_root), DEBIAN_RELEASE)
        ctx = _context(host)
        ctx.package = _package(tmp_path, {PEER: BAD})
        result = load.load_package(host, ctx.package, rdma_mode="on",
                                   peermem_rebuild=rebuild.rebuilder(ctx))
        assert result.rdma is not None and result.rdma.reason == "PeermemRebuildFailed"
        assert "no source package of driver 535.261.03" in result.rdma.message
        assert "package build --nvidia-source" in result.rdma.message
        _gpus_kept(host)


def test_symvers_lines_read_back_as_written() -> None:
    """What the rebuild gives modpost for nvidia's exports is what Module.symvers holds."""
    crcs = {"nvidia_p2p_get_pages": 0x0000BEEF, "nvidia_p2p_put_pages": 0xFFFFFFFF}
    text = modversions.symvers_text(crcs, "nvidia")
    assert modversions.parse_symvers(text, "nvidia") == crcs
    assert text.splitlines()[0] == "0x0000beef\tnvidia_p2p_get_pages\tnvidia\tEXPORT_SYMBOL\t"


def test_a_hung_make_is_stopped_within_its_bound(tmp_path: Path) -> None:
    """make that never ends is killed with its whole process group at the timeout."""
    from nvsources import fake_headers

    from installer.packages.builder.peermem import (
        PeermemBuildError,
        PeermemRequest,
        build_peermem,
    )

    if shutil.which("gcc-12") is None:
        pytest.skip("needs gcc-12 (the kernel's compiler): make deps")
    hung = tmp_path / "hung"
    shutil.copytree(STANDIN, hung)
    pidfile = tmp_path / "sleeper.pid"
    (hung / "Makefile").write_text(f"modules:\n\tsh -c 'echo $$$$ > {pidfile}; exec sleep 60'\n")
    source = _source_package(tmp_path / "source", hung)
    headers = fake_headers(tmp_path / "headers", DEBIAN_RELEASE)
    (tmp_path / "work").mkdir()
    with pytest.raises(PeermemBuildError, match="did not finish in 1 s"):
        build_peermem(PeermemRequest(source, headers, None, timeout_s=1.0), tmp_path / "work",
                      logs.get_logger())
    status = Path(f"/proc/{int(pidfile.read_text())}/status")
    for _ in range(50):  # SIGKILL is delivered at once; its exit is seen within moments
        try:
            if "zombie" in status.read_text().lower():
                break
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("make's child survived the timeout")


@pytest.fixture(scope="module")
def source_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding only a source package: stand-in user mode, the stand-in NVIDIA
    modules (tests/nvsources.py) and the NVIDIA-shaped nvidia-peermem tree beside them."""
    from native import build_standins
    from native.packages import standin_tree
    from nvsources import mini_source

    from installer.packages.builder import BuildRequest, build

    work = tmp_path_factory.mktemp("source")
    tree = standin_tree(work / "tree", build_standins(work / "built"), VERSION)
    nv = mini_source(work / "nv")
    shutil.copytree(STANDIN / "nvidia-peermem", nv / "nvidia-peermem")
    shutil.copyfile(STANDIN / "conftest.sh", nv / "conftest.sh")
    with (nv / "Kbuild").open("a") as kbuild:
        kbuild.write((STANDIN / "Kbuild").read_text().split("\n", 2)[2])
    build(BuildRequest(trees=(tree,), nvidia_source=nv, repo=work / "repo",
                       aliases=("default",), flavour="open"))
    return work / "repo"


def test_install_builds_the_package_then_rebuilds_peermem_for_ofed(
        tmp_path: Path, headers_root: Path, source_repo: Path) -> None:
    """The issue's case end to end: the package built without OFED (its peermem lacks the
    peer-memory API) on an OFED node; `install` with BUILD_FALLBACK=auto builds the package,
    then nvidia-peermem against /usr/src/ofa_kernel; exit 0, PeermemRebuilt in .ready.json,
    `status` and the RDMAReady condition's status True."""
    from e2e import run_cli, standin_env
    from helpers import node_args

    from installer.stages.signal import rdma_condition

    root = make_node(tmp_path / "n", headers_root)
    _ofed_node(root, DEBIAN_RELEASE)
    done = run_cli(["install", *node_args(root), "--log-format", "json", "--mirror",
                    f"file://{source_repo}", "--driver-version", VERSION, "--build-fallback",
                    "auto", "--rdma", "on"], standin_env(VERSION), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ready = json.loads((root / "home/kubernetes/bin/nvidia/.ready.json").read_text())
    assert ready["driver_version"] == VERSION
    verdict = ready["rdma"]
    assert verdict["reason"] == "PeermemRebuilt", verdict
    assert "without the peer-memory API" in verdict["message"]
    assert "nvidia_peermem" in (root / "proc/modules").read_text()
    assert "nvidia-peermem rebuilt on the node" in done.stderr
    condition = rdma_condition(RdmaVerdict(verdict["ready"], verdict["reason"],
                                           verdict["message"], RdmaStack(True, "ofed", None,
                                                                         (), ())))
    assert (condition["status"], condition["reason"]) == ("True", "PeermemRebuilt")
    status = run_cli(["status", *node_args(root)], standin_env(VERSION))
    assert status.returncode == 0, status.stderr
    assert "Optional:        nvidia-peermem loaded" in status.stdout, status.stdout
