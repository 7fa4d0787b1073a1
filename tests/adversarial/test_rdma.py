"""Hostile inputs to the nvidia-peermem check: a package's damaged `__versions`, and node
files standing for the loaded ib_core (a damaged or oversized OFED Module.symvers, a FIFO
or a link out of the host root where the module file should be).

Each case, through the real CLI in the sandbox: `install` exits 0 with the GPUs ready
(.ready.json, the driver loaded), peermem is not loaded, one log event names the cause in
one line, no traceback, and nothing changed in the arena but what a successful install
writes (its install dir, the device nodes, the validations file, the kernel's own state).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e import KERNEL, add_version

from adversarial.harness import VERSION, Arena, assert_untouched, install, settle
from installer.node import elf
from installer.node.host import Roots
from installer.testing.kernel import FakeKernelHost, module_file_bytes, write_host_module

PEER = "ib_register_peer_memory_client"
CORE = "updates/dkms/ib_core.ko"
# what a successful install writes on the node, besides the kernel's state
INSTALL_WRITES = ("node/home/kubernetes/bin/nvidia", "node/dev/", "node/run/", "node/proc/",
                  "node/sys/module/nvidia", "node/etc/ld.so.conf.d", "node/var")


def _peermem(versions: dict[str, int]) -> bytes:
    return module_file_bytes("nvidia_peermem", VERSION, ["nvidia", "ib_core"],
                             versions={"module_layout": 1, **versions}, kernel_release=KERNEL)


def _versions_size(data: bytes, size: int) -> bytes:
    """The module with its __versions section header claiming `size` bytes."""
    _, table = elf.sections(data)
    index = next(s.index for s in table if s.name == b"__versions")
    patched = bytearray(data)
    struct.pack_into("<Q", patched, struct.unpack_from("<Q", data, 40)[0] + index * 64 + 32,
                     size)
    return bytes(patched)


def _ofed_node(arena: Arena, peermem: bytes) -> Path:
    """An RDMA NIC, OFED's ib_core loaded since boot, and a package shipping `peermem`."""
    nic = arena.root / "sys/bus/pci/devices/0000:1a:00.0"
    nic.mkdir(parents=True)
    (nic / "vendor").write_text("0x15b3\n")
    (nic / "class").write_text("0x020700\n")
    (arena.root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    tree = arena.root / "lib/modules" / KERNEL
    write_host_module(tree, CORE, "ib_core", exports={PEER: 0x11111111},
                      srcversion="0FED0FED0FED0FED0FED0FE")
    (tree / "modules.dep").write_text(f"{CORE}:\n")
    (arena.root / "usr/src/ofa_kernel/x86_64" / KERNEL).mkdir(parents=True)
    FakeKernelHost(Roots(arena.root, arena.root / "proc", arena.root / "sys",
                         arena.root / "dev")).finit_module(tree / CORE, "")
    add_version(arena.scene, VERSION, extra_modules={"nvidia-peermem.ko": peermem})
    return tree / CORE


def _symvers(body: str) -> Callable[[Arena, Path], None]:
    def write(arena: Arena, core: Path) -> None:
        core.write_bytes(b"\x7fELF damaged")  # not the loaded module: Module.symvers is read
        (arena.root / "usr/src/ofa_kernel/x86_64" / KERNEL / "Module.symvers").write_text(body)
    return write


def _fifo(arena: Arena, core: Path) -> None:
    core.unlink()
    os.mkfifo(core)


def _link_out(arena: Arena, core: Path) -> None:
    """ib_core.ko a link to a file outside the host root: read (if at all) inside it."""
    core.unlink()
    core.symlink_to(arena.outside / "etc" / "sentinel.conf")


def _nothing(arena: Arena, core: Path) -> None:
    pass


CASES: dict[str, tuple[bytes, Callable[[Arena, Path], None], str, str]] = {
    "versions-truncated": (_versions_size(_peermem({PEER: 0x11111111}), 100), _nothing,
                           "PeermemInvalid", "not a whole number of 64-byte entries"),
    "versions-beyond-file": (_versions_size(_peermem({PEER: 0x11111111}), 1 << 40), _nothing,
                             "PeermemInvalid", "outside the file"),
    "versions-huge": (_peermem({f"s{i}": i for i in range(65537)}), _nothing,
                      "PeermemInvalid", "65538 entries (at most 65536)"),
    "symvers-garbage": (_peermem({PEER: 0x11111111}), _symvers("\x00\x01garbage\n"),
                        "SymbolVersionsUnknown", "is not '0xCRC"),
    "symvers-too-long": (_peermem({PEER: 0x11111111}),
                         _symvers("0x1\tx\tib_core\tEXPORT_SYMBOL\t\n" * 200_001),
                         "SymbolVersionsUnknown", "more than 200000 lines"),
    "ib-core-fifo": (_peermem({PEER: 0x11111111}), _fifo, "SymbolVersionsUnknown", "is a FIFO"),
    "ib-core-link-out": (_peermem({PEER: 0x11111111}), _link_out, "SymbolVersionsUnknown",
                         "ib_core.ko"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_rdma_inputs_leave_the_gpus_ready(arena: Arena, case: str) -> None:
    peermem, damage, reason, cause = CASES[case]
    core = _ofed_node(arena, peermem)
    damage(arena, core)
    settle(arena)
    before = arena.snapshot()
    done = install(arena, "--rdma", "auto")
    assert "Traceback" not in done.stderr and "error(internal)" not in done.stderr
    assert done.code == 0, done.stderr[-3000:]
    assert done.lines == [], done.lines
    refusals = [e for e in done.events if e.get("event") == "nvidia-peermem refused"]
    assert len(refusals) == 1, done.events
    detail = str(refusals[0]["detail"])
    assert refusals[0]["reason"] == reason and cause in detail and "\n" not in detail
    ready = json.loads((arena.install_dir / ".ready.json").read_text())
    assert ready["driver_version"] == VERSION and ready["rdma"]["reason"] == reason
    modules = (arena.root / "proc/modules").read_text()
    assert "nvidia " in modules and "nvidia_peermem" not in modules
    assert_untouched(before, arena.snapshot(), INSTALL_WRITES)


def _ofed_link_out(arena: Arena, core: Path) -> None:
    """OFED's `default` a link out of the host root (to a tree with a Module.symvers):
    resolved under the host root, it is no OFED tree; nothing outside is read or built."""
    outside = arena.outside / "ofa"
    outside.mkdir()
    (outside / "Module.symvers").write_text(f"0x11111111\t{PEER}\tib_core\tEXPORT_SYMBOL\t\n")
    (arena.root / "usr/src/ofa_kernel/x86_64" / KERNEL).rmdir()
    (arena.root / "usr/src/ofa_kernel/default").symlink_to(outside)


REBUILD_CASES: dict[str, tuple[Callable[[Arena, Path], None], str]] = {
    "ofed-tree-link-out": (_ofed_link_out, "has no OFED kernel tree for"),
    "ofed-tree-without-symvers": (_nothing, "has no OFED kernel tree for"),
}


@pytest.mark.parametrize("case", sorted(REBUILD_CASES))
def test_hostile_rebuild_inputs_leave_the_gpus_ready(arena: Arena, case: str) -> None:
    """BUILD_FALLBACK=auto and a mismatched peermem: a rebuild that cannot start is one
    PeermemRebuildFailed line naming the package's CRC and the cause; the GPUs stay."""
    damage, cause = REBUILD_CASES[case]
    core = _ofed_node(arena, _peermem({PEER: 0x0BAD0BAD}))
    damage(arena, core)
    settle(arena)
    before = arena.snapshot()
    done = install(arena, "--rdma", "auto", "--build-fallback", "auto")
    assert "Traceback" not in done.stderr and "error(internal)" not in done.stderr
    assert done.code == 0, done.stderr[-3000:]
    refusals = [e for e in done.events if e.get("event") == "nvidia-peermem refused"]
    assert len(refusals) == 1, done.events
    detail = str(refusals[0]["detail"])
    assert refusals[0]["reason"] == "PeermemRebuildFailed", detail
    assert cause in detail and "0x0bad0bad" in detail and "\n" not in detail
    ready = json.loads((arena.install_dir / ".ready.json").read_text())
    assert ready["driver_version"] == VERSION and ready["rdma"]["reason"] == "PeermemRebuildFailed"
    modules = (arena.root / "proc/modules").read_text()
    assert "nvidia " in modules and "nvidia_peermem" not in modules
    assert_untouched(before, arena.snapshot(), INSTALL_WRITES)
