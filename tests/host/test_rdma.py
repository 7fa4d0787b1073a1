"""nvidia-peermem over host trees with the simulated kernel: RDMA=auto|on|off, the symbol
version check against the loaded ib_core (inbox or MLNX_OFED/DOCA), hostile tables, and that
no outcome of the optional module withdraws the GPUs."""

from __future__ import annotations

import dataclasses
import errno
import struct
import subprocess
from pathlib import Path

import pytest

from installer.node import elf
from installer.node.host import Roots
from installer.node.rdma import RdmaStack, RdmaVerdict
from installer.packages.manifest import Package
from installer.stages import load
from installer.stages.load import rdma as peermem
from installer.stages.signal import rdma_condition
from installer.testing import SAMPLE_NODES, IbSpec, build_node, nic_vpd
from installer.testing.kernel import (
    FakeKernelHost,
    fake_module_set,
    module_file_bytes,
    write_host_module,
    write_package,
)

SPEC = SAMPLE_NODES["gke-ubuntu-t4"]
RELEASE = SPEC.kernel
VERSION = "535.261.03"
REGISTER, PEER = "ib_register_client", "ib_register_peer_memory_client"
INBOX = {REGISTER: 0xE2FFCD05, "ib_unregister_client": 0x0A1B2C3D}  # Debian 6.1's CRC
OFED = {**INBOX, PEER: 0x11111111, "ib_unregister_peer_memory_client": 0x22222222}
INBOX_CORE = "kernel/drivers/infiniband/core/ib_core.ko"
OFED_CORE = "updates/dkms/ib_core.ko"


def _node(tmp_path: Path, *, nic: bool = True) -> FakeKernelHost:
    spec = dataclasses.replace(SPEC, infiniband=(
        IbSpec("mlx5_0", "0000:1a:00.0", nic_vpd()),) if nic else ())
    root = build_node(tmp_path / "node", spec)
    return FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def _tree(host: FakeKernelHost) -> Path:
    return host.roots.host / "lib" / "modules" / RELEASE


def _ib_core(host: FakeKernelHost, exports: dict[str, int], *, ofed: str | None = None,
             loaded: bool = True, srcversion: str = "5D9E1A0C7B2F4E6A8C0D1E2") -> Path:
    """The node's ib_core in its modules tree (OFED's under updates/), loaded at boot."""
    relpath = OFED_CORE if ofed else INBOX_CORE
    write_host_module(_tree(host), relpath, "ib_core", exports=exports, srcversion=srcversion)
    (_tree(host) / "modules.dep").write_text(f"{relpath}:\n")
    if ofed:
        (host.roots.host / "usr/src/ofa_kernel/x86_64" / RELEASE).mkdir(parents=True)
        write_host_module(_tree(host), "updates/dkms/mlx_compat.ko", "mlx_compat")
        host.finit_module(_tree(host) / "updates/dkms/mlx_compat.ko", "")
    if loaded:
        host.finit_module(_tree(host) / relpath, "")
        if ofed:
            (host.roots.sys / "module/ib_core/version").write_text(ofed + "\n")
    return _tree(host) / relpath


def _load(host: FakeKernelHost, tmp_path: Path, versions: dict[str, int], *,
          mode: str = "auto", name: str = "pkg") -> load.LoadResult:
    """A package whose nvidia-peermem needs `versions` (`_package`), loaded under RDMA_MODE
    `mode`."""
    return load.load_package(host, _package(tmp_path, versions, name=name), rdma_mode=mode)


def _package(tmp_path: Path, versions: dict[str, int] | None = None, *,
             peermem_bytes: bytes | None = None, name: str = "pkg") -> Package:
    """A package shipping nvidia-peermem (a module file, not in `modules`)."""
    modules = fake_module_set(tmp_path / f"ko-{name}", VERSION)
    data = peermem_bytes if peermem_bytes is not None else module_file_bytes(
        "nvidia_peermem", VERSION, ["nvidia", "ib_core"],
        versions={"module_layout": 0x9060323F, **(versions or {})})
    extra = {"kernel/nvidia-peermem.ko": (data, "module")} if versions or peermem_bytes \
        else None
    return write_package(tmp_path / name, modules, driver_version=VERSION,
                         kernel_release=RELEASE, extra_files=extra)


def _loads(host: FakeKernelHost) -> list[str]:
    return [name for kind, name in host.calls if kind == "load"]


def _assert_gpus_kept(host: FakeKernelHost, result: load.LoadResult) -> None:
    assert host.version_of("nvidia") == VERSION and host.version_of("nvidia_uvm") == VERSION
    assert (host.roots.dev / "nvidiactl").exists() and (host.roots.dev / "nvidia0").exists()
    assert "nvidia_peermem" not in host.modules and "nvidia_peermem" not in result.loaded


class TestAuto:
    def test_node_without_rdma_leaves_peermem_out_quietly(self, tmp_path: Path) -> None:
        host = _node(tmp_path, nic=False)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and not result.rdma.ready
        assert result.rdma.reason == "NoRdmaStack"
        assert "ib_core not loaded" in result.rdma.message
        assert result.loaded == ["nvidia", "nvidia_uvm"] and result.warnings == []
        _assert_gpus_kept(host, result)

    def test_nic_without_ib_core_is_no_stack(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX, loaded=False)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and result.rdma.reason == "NoRdmaStack"
        assert "1 RDMA NIC(s), ib_core not loaded" in result.rdma.message
        assert "ib_core.ko" not in _loads(host)

    def test_rdma_node_loads_peermem_after_nvidia_and_ib_core(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and result.rdma.ready, result.rdma
        assert result.rdma.reason == "PeermemLoaded"
        assert _loads(host) == ["ib_core.ko", "nvidia.ko", "nvidia-uvm.ko",
                                "nvidia-peermem.ko"]
        assert result.loaded == ["nvidia", "nvidia_uvm", "nvidia_peermem"]
        assert host.modules["nvidia_peermem"].depends == ("nvidia", "ib_core")
        assert result.rdma.stack.kind == "inbox" and result.rdma.stack.nics == (
            "0000:1a:00.0",) and result.rdma.stack.devices == ("mlx5_0",)
        again = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]}, name="again")
        assert again.rdma is not None and again.rdma.ready and not again.changed
        assert "nvidia_peermem" in again.kept

    def test_ofed_stack_with_matching_crcs_loads(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, OFED, ofed="24.10-1.1.4")
        result = _load(host, tmp_path, {PEER: OFED[PEER]})
        assert result.rdma is not None and result.rdma.ready, result.rdma
        assert result.rdma.stack.kind == "ofed" and result.rdma.stack.version == "24.10-1.1.4"
        assert "MLNX_OFED/DOCA ib_core 24.10-1.1.4" in result.rdma.message


    @pytest.mark.parametrize(("tool", "suffix"), [(["xz"], ".xz"), (["gzip"], ".gz"),
                                                  (["zstd", "-q", "--rm"], ".zst")])
    def test_a_compressed_ib_core_is_read(self, tmp_path: Path, tool: list[str],
                                          suffix: str) -> None:
        """Distributions compress their modules (Debian xz, Ubuntu zstd), packed here by the
        real tools: the CRCs are read through the compression, so a mismatch is still seen."""
        host = _node(tmp_path)
        path = _ib_core(host, INBOX)  # loaded at boot; the file on disk is then compressed
        subprocess.run([*tool, str(path)], check=True)
        (_tree(host) / "modules.dep").write_text(f"{INBOX_CORE}{suffix}:\n")
        result = _load(host, tmp_path, {REGISTER: 0x5EED0001})
        verdict = result.rdma
        assert verdict is not None and verdict.reason == "SymbolVersionMismatch", verdict
        assert f"{path}{suffix}" in verdict.message
        assert f"{INBOX[REGISTER]:#010x}" in verdict.message
        _assert_gpus_kept(host, result)


class TestRefusals:
    def test_crc_mismatch_is_refused_before_loading_with_both_named(
            self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, OFED, ofed="24.10-1.1.4")
        result = _load(host, tmp_path, {PEER: 0x5EED0001})
        verdict = result.rdma
        assert verdict is not None and verdict.reason == "SymbolVersionMismatch"
        assert "nvidia-peermem.ko" not in _loads(host)
        assert result.warnings == [verdict.message] and "\n" not in verdict.message
        for part in (f"nvidia-peermem {VERSION}", f"kernel {RELEASE}", PEER, "0x5eed0001",
                     "0x11111111", "MLNX_OFED/DOCA ib_core 24.10-1.1.4",
                     str(_tree(host) / OFED_CORE)):
            assert part in verdict.message
        _assert_gpus_kept(host, result)

    def test_inbox_ib_core_without_the_peer_api(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        result = _load(host, tmp_path, {PEER: OFED[PEER]})
        assert result.rdma is not None and result.rdma.reason == "PeerMemoryApiMissing"
        assert f"needs {PEER}, which the loaded inbox ib_core {RELEASE}" in result.rdma.message
        _assert_gpus_kept(host, result)

    def test_replaced_module_file_falls_back_to_ofed_symvers(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        path = _ib_core(host, OFED, ofed="24.10-1.1.4")
        path.write_bytes(module_file_bytes("ib_core", exports={PEER: 0x7}, srcversion="NEWER"))
        symvers = host.roots.host / "usr/src/ofa_kernel/x86_64" / RELEASE / "Module.symvers"
        symvers.write_text("".join(f"{crc:#010x}\t{name}\tdrivers/infiniband/core/ib_core\t"
                                   "EXPORT_SYMBOL\t\n" for name, crc in OFED.items()))
        result = _load(host, tmp_path, {PEER: OFED[PEER]})
        assert result.rdma is not None and result.rdma.ready, result.rdma
        symvers.unlink()
        host.delete_module("nvidia_peermem")
        again = _load(host, tmp_path, {PEER: OFED[PEER]}, name="b")
        assert again.rdma is not None and again.rdma.reason == "SymbolVersionsUnknown"
        assert "srcversion NEWER, loaded 5D9E1A0C7B2F4E6A8C0D1E2" in again.rdma.message

    @pytest.mark.parametrize(("loaded_id", "ready"), [(b"\x04GNU-id-1", True),
                                                      (b"\x04GNU-id-2", False)])
    def test_without_srcversion_the_build_id_tells(self, tmp_path: Path, loaded_id: bytes,
                                                   ready: bool) -> None:
        """Debian's modules have no srcversion: the GNU build ID note identifies the file."""
        host = _node(tmp_path)
        path = _tree(host) / INBOX_CORE
        path.parent.mkdir(parents=True)
        path.write_bytes(module_file_bytes("ib_core", exports=INBOX, build_id=b"\x04GNU-id-1"))
        (_tree(host) / "modules.dep").write_text(f"{INBOX_CORE}:\n")
        host.finit_module(path, "")
        notes = host.roots.sys / "module/ib_core/notes"
        notes.mkdir()
        (notes / ".note.gnu.build-id").write_bytes(loaded_id)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and result.rdma.ready is ready, result.rdma
        if not ready:
            assert result.rdma.reason == "SymbolVersionsUnknown"
            assert "GNU build ID differs" in result.rdma.message

    def test_kernel_refusal_keeps_the_gpus(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        host.fail_next["nvidia_peermem"] = errno.EINVAL
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and result.rdma.reason == "PeermemLoadFailed"
        assert "EINVAL" in result.rdma.message and result.warnings == [result.rdma.message]
        _assert_gpus_kept(host, result)


class TestModes:
    def test_off_never_loads(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]}, mode="off")
        assert result.rdma is not None and result.rdma.reason == "RdmaDisabled"
        assert result.warnings == []
        _assert_gpus_kept(host, result)

    def test_on_loads_the_nodes_ib_core_first(self, tmp_path: Path) -> None:
        host = _node(tmp_path, nic=False)
        _ib_core(host, INBOX, loaded=False)
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]}, mode="on")
        assert result.rdma is not None and result.rdma.ready, result.rdma
        assert _loads(host) == ["nvidia.ko", "nvidia-uvm.ko", "ib_core.ko",
                                "nvidia-peermem.ko"]

    def test_package_without_peermem(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        result = load.load_package(host, _package(tmp_path), rdma_mode="on")
        assert result.rdma is not None and result.rdma.reason == "PeermemNotShipped"

    def test_no_mode_considers_nothing(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        result = load.load_package(host, _package(tmp_path, {REGISTER: 1}))
        assert result.rdma is None


def _resize_versions(data: bytes, size: int | None = None, offset: int | None = None
                     ) -> bytes:
    """The module with its __versions section header's size or offset rewritten."""
    _, table = elf.sections(data)
    index = next(s.index for s in table if s.name == b"__versions")
    shoff = struct.unpack_from("<Q", data, 40)[0]
    header = shoff + index * 64
    patched = bytearray(data)
    if size is not None:
        struct.pack_into("<Q", patched, header + 32, size)
    if offset is not None:
        struct.pack_into("<Q", patched, header + 24, offset)
    return bytes(patched)


def _peermem(versions: dict[str, int]) -> bytes:
    return module_file_bytes("nvidia_peermem", VERSION, ["nvidia", "ib_core"],
                             versions=versions)


HOSTILE_PEERMEM = {
    "truncated-versions": (_resize_versions(_peermem({REGISTER: 1, "a": 2}), size=100),
                           "not a whole number of 64-byte entries"),
    "versions-outside-file": (_resize_versions(_peermem({REGISTER: 1}), offset=1 << 40),
                              "outside the file"),
    "huge-versions": (_peermem({f"sym{i}": i for i in range(65537)}), "65537 entries"),
    "nameless-entry": (_peermem({"": 1}), "has no symbol name"),
    "not-elf": (b"MZ" + b"\0" * 200, "not an ELF file"),
}


class TestHostile:
    @pytest.mark.parametrize("case", sorted(HOSTILE_PEERMEM))
    def test_hostile_peermem_is_refused_in_one_line(self, tmp_path: Path, case: str) -> None:
        data, expected = HOSTILE_PEERMEM[case]
        host = _node(tmp_path)
        _ib_core(host, INBOX)
        before = _files(host.roots.host)
        result = load.load_package(host, _package(tmp_path, peermem_bytes=data),
                                   rdma_mode="auto")
        assert result.rdma is not None and result.rdma.reason in peermem.REFUSALS
        assert expected in result.rdma.message and "\n" not in result.rdma.message
        assert result.warnings == [result.rdma.message]
        _assert_gpus_kept(host, result)
        assert _outside_kernel_state(before, _files(host.roots.host)) == set()

    @pytest.mark.parametrize(("symvers", "expected"), [
        ("garbage without tabs\n", "line 1 is not '0xCRC"),
        ("0x1\tib_register_client\n", "line 1 is not '0xCRC"),
        ("0x1ffffffff\tib_x\tib_core\tEXPORT_SYMBOL\n", "not a 32-bit CRC"),
        ("0x1\tib_x\tib_core\tEXPORT_SYMBOL\n" * 200_001, "more than 200000 lines"),
    ])
    def test_hostile_ofed_symvers_is_refused(self, tmp_path: Path, symvers: str,
                                             expected: str) -> None:
        host = _node(tmp_path)
        path = _ib_core(host, OFED, ofed="24.10-1.1.4")
        path.write_bytes(b"\x7fELF-damaged")
        (host.roots.host / "usr/src/ofa_kernel/x86_64" / RELEASE / "Module.symvers"
         ).write_text(symvers)
        result = _load(host, tmp_path, {PEER: OFED[PEER]})
        assert result.rdma is not None and result.rdma.reason == "SymbolVersionsUnknown"
        assert expected in result.rdma.message and "\n" not in result.rdma.message
        _assert_gpus_kept(host, result)

    def test_damaged_ib_core_file_is_refused(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        path = _ib_core(host, INBOX)
        data = bytearray(path.read_bytes())
        data[40:48] = struct.pack("<Q", 1 << 62)  # e_shoff far outside the file
        path.write_bytes(bytes(data))
        result = _load(host, tmp_path, {REGISTER: INBOX[REGISTER]})
        assert result.rdma is not None and result.rdma.reason == "SymbolVersionsUnknown"
        assert "section table missing or truncated" in result.rdma.message
        _assert_gpus_kept(host, result)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.is_symlink()}


def _outside_kernel_state(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    """Paths changed outside what the kernel itself shows (/proc, /sys, /dev nodes)."""
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return {p for p in changed if not p.startswith(("proc/", "sys/", "dev/"))}


class TestCondition:
    @pytest.mark.parametrize(("ready", "reason", "status"), [
        (True, "PeermemLoaded", "True"), (False, "SymbolVersionMismatch", "False"),
        (False, "NoRdmaStack", "False")])
    def test_condition_says_why(self, ready: bool, reason: str, status: str) -> None:
        stack = RdmaStack(True, "inbox", RELEASE, ("mlx5_0",), ())
        condition = rdma_condition(RdmaVerdict(ready, reason, "m" * 2000, stack))
        assert condition["type"] == "gpu-node-installer/RDMAReady"
        assert (condition["status"], condition["reason"]) == (status, reason)
        assert len(condition["message"]) == 1024

    def test_only_nodes_with_some_rdma_get_the_condition(self) -> None:
        bare = RdmaStack(False, "none", None, (), ())
        assert not RdmaVerdict(False, "NoRdmaStack", "m", bare, "auto").concerns_node
        assert not RdmaVerdict(False, "RdmaDisabled", "m", bare, "off").concerns_node
        assert RdmaVerdict(False, "PeermemLoadFailed", "m", bare, "on").concerns_node
        nic = RdmaStack(False, "none", None, (), ("0000:1a:00.0",))
        assert RdmaVerdict(False, "NoRdmaStack", "m", nic, "auto").concerns_node
