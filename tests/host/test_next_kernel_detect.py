"""Finding the next kernel (installer.agent.nextkernel.Detector over installer.node.kernels)
on a temp host tree: a tree appearing is seen at the next round through inotify, or by the
>= 60 s scan without it; older kernels, incomplete trees and hostile entries are ignored,
each decision logged once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nextkernels import NEXT, OLDER, RUNNING, Log, add_tree, boot_link, host_tree

from installer.agent.nextkernel import SCAN_S, Detector
from installer.node import kernels


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(root: Path, *, use_inotify: bool = True) -> tuple[Detector, Clock, Log]:
    clock, log = Clock(), Log()
    found = Detector(host_tree(root), log, use_inotify=use_inotify, clock=clock)
    return found, clock, log


class TestInotify:
    """A change is seen at the first round after it, with no scan due."""

    def test_a_second_tree_is_found_at_the_next_round(self, tmp_path: Path) -> None:
        found, clock, _ = detector(tmp_path)
        assert found.watcher is not None
        assert found.due() and found.look() is None
        assert not found.due()  # nothing changed, no scan due
        add_tree(tmp_path, NEXT)
        clock.now += 1
        assert found.due() and found.look() == NEXT
        found.close()

    def test_depmod_finishing_a_tree_is_seen(self, tmp_path: Path) -> None:
        """The package unpacks kernel/ first, depmod writes modules.dep last: only then."""
        found, _, _ = detector(tmp_path)
        add_tree(tmp_path, NEXT, depmod=False)
        assert found.due() and found.look() is None  # unpacking: not installed yet
        assert not found.due()
        add_tree(tmp_path, NEXT)  # modules.dep renamed into the tree's own directory
        assert found.due() and found.look() == NEXT
        found.close()

    def test_boot_link_and_reboot_marker_wake_a_look(self, tmp_path: Path) -> None:
        found, _, log = detector(tmp_path)
        add_tree(tmp_path, NEXT)
        add_tree(tmp_path, "6.1.0-59-amd64")
        assert found.due() and found.look() == "6.1.0-59-amd64"  # newest tree
        boot_link(tmp_path, "/vmlinuz", f"boot/vmlinuz-{NEXT}")
        assert found.due() and found.look() == NEXT  # the boot default wins
        (tmp_path / "var/run/reboot-required.pkgs").write_text("linux-image-6.1.0-58-amd64\n")
        (tmp_path / "var/run/reboot-required").write_text("*** System restart required ***\n")
        assert found.due()
        found.look()
        said = log.events("next kernel: the node asks for a reboot")
        assert said == [{"marker": "/var/run/reboot-required",
                         "packages": ["linux-image-6.1.0-58-amd64"]}]
        found.close()

    def test_an_unrelated_change_wakes_no_look(self, tmp_path: Path) -> None:
        found, _, _ = detector(tmp_path)
        found.look()
        (tmp_path / "var/run/other.pid").write_text("1\n")
        (tmp_path / "boot/config-x").write_text("")
        assert not found.due()
        found.close()


class TestScan:
    """Without inotify: a look every SCAN_S (60 s), never more often."""

    def test_a_second_tree_is_found_by_the_scan(self, tmp_path: Path) -> None:
        found, clock, _ = detector(tmp_path, use_inotify=False)
        assert found.scan_s == SCAN_S >= 60
        assert found.due() and found.look() is None
        add_tree(tmp_path, NEXT)
        clock.now += SCAN_S - 1
        assert not found.due()
        clock.now += 1
        assert found.due() and found.look() == NEXT


class TestDecisions:
    def test_older_and_running_kernels_are_ignored_and_said_once(self, tmp_path: Path) -> None:
        found, _, log = detector(tmp_path)
        add_tree(tmp_path, OLDER)
        boot_link(tmp_path, "/boot/vmlinuz", f"vmlinuz-{RUNNING}")
        for _ in range(3):
            assert found.look() is None
        ignored = log.events("next kernel: ignored")
        assert sorted((e["kernel"], e["reason"]) for e in ignored) == [
            (OLDER, "not newer than the running kernel"),
            (RUNNING, "the running kernel"), (RUNNING, "the running kernel")]  # tree, link
        found.close()

    @pytest.mark.parametrize("missing", ["modules", "depmod"])
    def test_an_incomplete_tree_is_no_kernel(self, tmp_path: Path, missing: str) -> None:
        found, _, _ = detector(tmp_path)
        add_tree(tmp_path, NEXT, **{missing: False})  # type: ignore[arg-type]
        assert found.look() is None
        found.close()


class TestHostile:
    """Entries that are no kernel: ignored with one log line, never a candidate."""

    def test_a_modules_entry_linking_out_of_the_host_root(self, tmp_path: Path) -> None:
        found, _, log = detector(tmp_path / "node")
        outside = tmp_path / "outside" / "9.9.9-1-amd64"
        (outside / "kernel").mkdir(parents=True)
        (outside / "modules.dep").write_text("")
        (tmp_path / "node/lib/modules/9.9.9-1-amd64").symlink_to(outside)
        (tmp_path / "node/lib/modules/9.9.8-1-amd64").symlink_to("../../../outside/9.9.9-1-amd64")
        assert found.look() is None
        ignored = {e["path"]: e["reason"] for e in log.events("next kernel: entry ignored")}
        assert ignored == {"/lib/modules/9.9.9-1-amd64": "is a symbolic link, not a modules tree",
                           "/lib/modules/9.9.8-1-amd64": "is a symbolic link, not a modules tree"}
        found.close()

    def test_odd_names(self, tmp_path: Path) -> None:
        found, _, log = detector(tmp_path)
        odd = ["9..9-amd64", "9.9 9", "9" + "9" * 200, "-9.9", "9.9\n"]
        for name in odd:
            add_tree(tmp_path, name)
        assert found.look() is None
        reasons = {e["reason"] for e in log.events("next kernel: entry ignored")}
        assert reasons == {"is no kernel release name"}
        assert len(log.events("next kernel: entry ignored")) == len(odd)
        assert all(len(e["path"]) <= 13 + 80 for e in log.events("next kernel: entry ignored"))
        found.close()

    @pytest.mark.parametrize("target", ["/etc/passwd", "../../outside/vmlinuz-9.9.9-1-amd64",
                                        "/outside/boot/vmlinuz-9.9.9-1-amd64",
                                        "boot/vmlinuz-../../x", "boot/vmlinuz-"])
    def test_a_boot_link_pointing_elsewhere(self, tmp_path: Path, target: str) -> None:
        found, _, log = detector(tmp_path)
        boot_link(tmp_path, "/vmlinuz", target)
        assert found.look() is None
        assert [e["path"] for e in log.events("next kernel: entry ignored")] == ["/vmlinuz"]
        found.close()

    def test_a_fifo_for_the_marker_is_not_read(self, tmp_path: Path) -> None:
        host = host_tree(tmp_path)
        os.mkfifo(tmp_path / "var/run/reboot-required.pkgs")
        (tmp_path / "var/run/reboot-required").write_text("")
        looked = kernels.look(host)  # returns: the FIFO is never opened for reading
        assert looked.reboot_required and looked.reboot_packages == ()
