"""Device nodes: numbers from the driver, modes, /dev/char links, keep/replace, uvm last."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.node.host import Roots
from installer.stages.load import devnodes
from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import FakeKernelHost, fake_module_set


@pytest.fixture
def host(tmp_path: Path) -> FakeKernelHost:
    """A node with the fake nvidia and nvidia-uvm 535 loaded, two GPUs."""
    root = build_node(tmp_path / "node", SAMPLE_NODES["gke-ubuntu-t4"])
    fake = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"), gpus=2)
    for module in fake_module_set(tmp_path / "ko", "535.261.03"):
        fake.finit_module(module.source, "")
    return fake


def _by_name(nodes: list[devnodes.DeviceNode]) -> dict[str, tuple[int, int, int]]:
    return {n.name: (n.major, n.minor, n.mode) for n in nodes}


class TestPlan:
    def test_numbers_come_from_the_driver(self, host: FakeKernelHost) -> None:
        nodes = _by_name(devnodes.plan(host))
        uvm = host.modules["nvidia_uvm"].majors["nvidia-uvm"]
        caps = host.modules["nvidia"].majors["nvidia-caps"]
        assert nodes == {
            "nvidiactl": (195, 255, 0o666), "nvidia0": (195, 0, 0o666),
            "nvidia1": (195, 1, 0o666),
            "nvidia-caps/nvidia-cap1": (caps, 1, 0o400),
            "nvidia-caps/nvidia-cap2": (caps, 2, 0o444),
            "nvidia-uvm-tools": (uvm, 1, 0o666), "nvidia-uvm": (uvm, 0, 0o666)}

    def test_imex_default_channel_only_when_asked_and_the_driver_has_the_device(
            self, host: FakeKernelHost) -> None:
        """NVIDIA's IMEX guide: channel N is minor N of the major /proc/devices names
        `nvidia-caps-imex-channels` (dynamic: 234 in the guide, read here, never assumed)."""
        assert not any("imex" in n.name for n in devnodes.plan(host, imex_channel=True))
        host.modules["nvidia"].majors["nvidia-caps-imex-channels"] = 234
        host.write_state()
        assert not any("imex" in n.name for n in devnodes.plan(host))
        nodes = devnodes.plan(host, imex_channel=True)
        assert _by_name(nodes)["nvidia-caps-imex-channels/channel0"] == (234, 0, 0o666)
        assert nodes[-1].name == "nvidia-uvm"
        result = devnodes.ensure_nodes(host, nodes)
        assert "nvidia-caps-imex-channels/channel0" in result.created
        assert host.char_device(host.roots.dev / "nvidia-caps-imex-channels" / "channel0"
                                ) == (234, 0, 0o666)
        assert host.readlink(host.roots.dev / "char" / "234:0") == \
            "../nvidia-caps-imex-channels/channel0"

    def test_uvm_is_last(self, host: FakeKernelHost) -> None:
        assert devnodes.plan(host)[-1].name == "nvidia-uvm"

    def test_modeset_node_only_with_the_modeset_module(self, host: FakeKernelHost,
                                                        tmp_path: Path) -> None:
        assert "nvidia-modeset" not in _by_name(devnodes.plan(host))
        (host.roots.sys / "module" / "nvidia_modeset").mkdir(parents=True)
        (host.roots.sys / "module" / "nvidia_modeset" / "refcnt").write_text("0\n")
        assert _by_name(devnodes.plan(host))["nvidia-modeset"] == (195, 254, 0o666)

    def test_nothing_without_the_driver(self, tmp_path: Path) -> None:
        root = build_node(tmp_path / "n", SAMPLE_NODES["gke-ubuntu-t4"])
        fake = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
        assert devnodes.plan(fake) == []

    def test_gpu_minors_follow_device_minor_not_directory_order(
            self, host: FakeKernelHost) -> None:
        gpus = host.roots.proc / "driver" / "nvidia" / "gpus"
        (gpus / "0000:00:1e.0" / "information").write_text("Device Minor: \t 7\n")
        assert devnodes.gpu_minors(host) == [1, 7]


class TestEnsure:
    def test_creates_nodes_and_char_links(self, host: FakeKernelHost) -> None:
        result = devnodes.ensure_nodes(host, devnodes.plan(host))
        dev = host.roots.dev
        assert "nvidiactl" in result.created and not result.replaced
        assert host.char_device(dev / "nvidiactl") == (195, 255, 0o666)
        assert (dev / "char" / "195:255").readlink() == Path("../nvidiactl")
        uvm = host.modules["nvidia_uvm"].majors["nvidia-uvm"]
        assert (dev / "char" / f"{uvm}:0").readlink() == Path("../nvidia-uvm")
        caps = host.modules["nvidia"].majors["nvidia-caps"]
        assert (dev / "char" / f"{caps}:1").readlink() == Path("../nvidia-caps/nvidia-cap1")
        mknods = [name for call, name in host.calls if call == "mknod"]
        assert mknods[-1] == "nvidia-uvm"

    def test_second_run_changes_nothing(self, host: FakeKernelHost) -> None:
        devnodes.ensure_nodes(host, devnodes.plan(host))
        before = len(host.calls)
        result = devnodes.ensure_nodes(host, devnodes.plan(host))
        assert not result.changed and len(result.kept) == 7
        assert host.calls[before:] == []

    def test_wrong_node_and_wrong_link_are_replaced(self, host: FakeKernelHost) -> None:
        dev = host.roots.dev
        host.mknod_char(dev / "nvidiactl", 195, 254, 0o600)
        (dev / "char").mkdir()
        (dev / "char" / "195:0").symlink_to("../somewhere-else")
        (dev / "nvidia0").write_text("a stray regular file")
        result = devnodes.ensure_nodes(host, devnodes.plan(host))
        assert set(result.replaced) == {"nvidiactl", "nvidia0"}
        assert host.char_device(dev / "nvidiactl") == (195, 255, 0o666)
        assert (dev / "char" / "195:0").readlink() == Path("../nvidia0")

    def test_remove_uvm_nodes(self, host: FakeKernelHost) -> None:
        devnodes.ensure_nodes(host, devnodes.plan(host))
        assert devnodes.remove_uvm_nodes(host) == ["nvidia-uvm", "nvidia-uvm-tools"]
        assert not (host.roots.dev / "nvidia-uvm").exists()
        assert (host.roots.dev / "nvidiactl").exists()


class TestOwnNodes:
    """The record of nodes we made, the gate withdrawn (ours only) and held back."""

    def test_withdraws_only_the_gate_nodes_it_made(self, host: FakeKernelHost,
                                                   tmp_path: Path) -> None:
        record = tmp_path / "devnodes.json"
        devnodes.ensure_nodes(host, devnodes.plan(host), record=record)
        dev = host.roots.dev
        other = dev / ".nvidia-uvm.other"  # another tool re-made nvidia-uvm: a new inode
        other.write_text((dev / "nvidia-uvm").read_text())
        other.replace(dev / "nvidia-uvm")
        assert devnodes.withdraw(host, record) == ["nvidiactl", "nvidia-uvm-tools"]
        assert not (dev / "nvidiactl").exists() and not (dev / "char" / "195:255").exists()
        assert (dev / "nvidia-uvm").exists() and (dev / "nvidia0").exists()
        assert devnodes.withdraw(host, record) == []  # gone from the record too

    def test_nothing_is_ours_from_another_boot(self, host: FakeKernelHost,
                                               tmp_path: Path) -> None:
        boot = host.roots.proc / "sys/kernel/random/boot_id"
        boot.parent.mkdir(parents=True)
        boot.write_text("first-boot\n")
        record = tmp_path / "devnodes.json"
        devnodes.ensure_nodes(host, devnodes.plan(host), record=record)
        boot.write_text("second-boot\n")
        assert devnodes.read_record(host, record) == {}
        assert devnodes.withdraw(host, record) == []
        assert (host.roots.dev / "nvidiactl").exists()

    def test_held_nodes_are_not_made_while_absent(self, host: FakeKernelHost,
                                                  tmp_path: Path) -> None:
        result = devnodes.ensure_nodes(host, devnodes.plan(host), hold=devnodes.GATE,
                                       record=tmp_path / "r.json")
        assert result.held == ["nvidiactl", "nvidia-uvm-tools", "nvidia-uvm"]
        assert not any((host.roots.dev / n).exists() for n in devnodes.GATE)
        assert (host.roots.dev / "nvidia0").exists()
        again = devnodes.ensure_nodes(host, devnodes.plan(host), record=tmp_path / "r.json")
        assert set(again.created) == set(devnodes.GATE)  # released: made as any other

    def test_an_unreadable_record_makes_nothing_ours(self, host: FakeKernelHost,
                                                     tmp_path: Path) -> None:
        devnodes.ensure_nodes(host, devnodes.plan(host))
        record = tmp_path / "devnodes.json"
        for text in ("not json", "[]", '{"boot_id": "", "nodes": {"nvidiactl": [195]}}'):
            record.write_text(text)
            assert devnodes.withdraw(host, record) == []
        assert (host.roots.dev / "nvidiactl").exists()


class TestRealHostNodes:
    """RealHost's own mknod and links, where this process may create device nodes."""

    def test_mknod_char_exact_mode_and_replace(self, tmp_path: Path) -> None:
        from installer.node.host import RealHost

        real = RealHost(Roots(tmp_path, tmp_path, tmp_path, tmp_path))
        try:
            real.mknod_char(tmp_path / "nvidiactl", 195, 255, 0o666)
        except PermissionError:
            pytest.skip("creating device nodes needs CAP_MKNOD (run as root)")
        assert real.char_device(tmp_path / "nvidiactl") == (195, 255, 0o666)
        real.mknod_char(tmp_path / "nvidiactl", 195, 254, 0o600)
        assert real.char_device(tmp_path / "nvidiactl") == (195, 254, 0o600)
        assert real.char_device(tmp_path / "absent") is None
        real.symlink("../nvidiactl", tmp_path / "char" / "195:254")
        real.symlink("../other", tmp_path / "char" / "195:254")
        assert (tmp_path / "char" / "195:254").readlink() == Path("../other")
