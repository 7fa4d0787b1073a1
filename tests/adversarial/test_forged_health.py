"""Forged GPU health: kernel log records that look like the driver's Xid lines but are not.

Anyone on a node can write to /dev/kmsg (user space gets facility LOG_USER, never the
kernel's 0) and the kernel logs audit records that quote command lines. Only a record the
kernel wrote, whose message starts with `NVRM: Xid (`, for a GPU sysfs lists, counts.
Each case writes records to the node's /dev/kmsg (a plain file in the arena), runs the
agent's Xid reader sandboxed (healthprobe.py `xids`, reporting to a fake API server on
127.0.0.1), and asserts what was counted, that no condition or Event reached the Node, the
one log line naming the cause, and that nothing changed in the arena.
"""

from __future__ import annotations

from pathlib import Path

import kubefake
import pytest
from healthkit import NODE, XID13, XID79, fake_cluster, record

from adversarial.harness import assert_untouched
from adversarial.sandboxed import Probe, SmallArena, run_probe, small_arena
from installer.agent import health
from installer.agent.health import MAX_SERIES

REAL_GPUS = ("0000:3b:00", "0000:b1:00", "0000:00:1e")


@pytest.fixture
def arena(tmp_path: Path) -> SmallArena:
    return small_arena(tmp_path / "arena")


def run_xids(arena: SmallArena, records: bytes, tmp_path: Path
             ) -> tuple[Probe, kubefake.Cluster]:
    """Write the log, read it through the agent's reader, report to a fake API."""
    (arena.node / "dev/kmsg").write_bytes(records)
    token = tmp_path / "token"
    token.write_text(kubefake.TOKEN + "\n")
    cluster = fake_cluster()
    before = arena.listing()
    with kubefake.serve(cluster) as url:
        probe = run_probe(arena, "xids", str(arena.node), url, str(token), NODE)
    assert probe.code == 0, probe.stderr[-3000:]
    assert_untouched(before, arena.listing())
    return probe, cluster


def refusals(probe: Probe) -> list[dict[str, object]]:
    return [e for e in probe.events if e.get("event") == "kernel log record refused as an Xid"]


def assert_nothing_reported(cluster: kubefake.Cluster) -> None:
    assert health.CONDITION not in kubefake.conditions(cluster)
    assert [e["reason"] for e in cluster.events] == []


class TestUserSpaceWrites:
    """`echo '<3>NVRM: Xid ...' > /dev/kmsg` is stored with facility 1 (LOG_USER)."""

    @pytest.mark.parametrize("prio", [11, 14, 8 * 23 + 3], ids=["<3>", "plain", "local7"])
    def test_a_forged_critical_xid_is_not_counted(self, arena: SmallArena, tmp_path: Path,
                                                  prio: int) -> None:
        probe, cluster = run_xids(arena, record(1, XID79, prio=prio) + record(2, XID13),
                                  tmp_path)
        assert probe.result["counts"] == {"0000:b1:00": {"13": 1}}  # the real one only
        assert probe.result["refused"] == {"not-kernel": 1}
        assert_nothing_reported(cluster)
        [line] = refusals(probe)
        assert "not written by the kernel" in str(line["reason"])
        assert f"facility {prio >> 3}" in str(line["reason"])

    def test_the_same_line_from_the_kernel_is_counted_and_reported(
            self, arena: SmallArena, tmp_path: Path) -> None:
        probe, cluster = run_xids(arena, record(1, XID79, prio=3), tmp_path)
        assert probe.result["counts"] == {"0000:3b:00": {"79": 1}}
        assert kubefake.conditions(cluster)[health.CONDITION]["reason"] == "Xid:79"
        assert refusals(probe) == []


class TestQuotedXidLines:
    """Kernel-facility records whose message only quotes an Xid line."""

    @pytest.mark.parametrize("message", [
        'audit: type=1400 audit(1733370000.123:42): apparmor="DENIED" operation="exec" '
        f'comm="{XID79}"',
        f"audit: type=1105 audit(1733370000.200:43): pid=1 uid=0 msg='op=PAM:session {XID79}'",
        f"usb 1-1: {XID79}",
        f" {XID79}"], ids=["apparmor", "pam", "device", "leading-space"])
    def test_a_quoted_line_is_not_an_xid(self, arena: SmallArena, tmp_path: Path,
                                         message: str) -> None:
        probe, cluster = run_xids(arena, record(7, message, prio=5), tmp_path)
        assert probe.result["counts"] == {}
        assert probe.result["last_seq"] == 7  # read, and refused
        assert_nothing_reported(cluster)
        [line] = refusals(probe)
        assert "does not start with the driver's 'NVRM: Xid ('" in str(line["reason"])


class TestForgedAddresses:
    def test_five_thousand_addresses_make_no_series(self, arena: SmallArena,
                                                    tmp_path: Path) -> None:
        forged = b"".join(
            record(i + 1, f"NVRM: Xid (PCI:0000:{(i >> 8) + 0x40:02x}:{i & 0xff:02x}): 79, "
                   "pid=1, name=x, GPU has fallen off the bus.")
            for i in range(5000))
        probe, cluster = run_xids(arena, forged + record(5001, XID13), tmp_path)
        assert probe.result["gpus"] == sorted(REAL_GPUS)
        assert probe.result["counts"] == {"0000:b1:00": {"13": 1}}  # 1 series, not 5,001
        assert probe.result["refused"] == {"unknown-gpu": 5000}
        assert probe.result["last_seq"] == 5001
        assert_nothing_reported(cluster)
        [line] = refusals(probe)  # a flood is said once
        assert "GPU 0000:40:00 is not on this node (sysfs lists 3 GPU(s))" in str(
            line["reason"])

    def test_a_node_without_gpus_in_sysfs_counts_nothing(self, tmp_path: Path) -> None:
        arena = small_arena(tmp_path / "arena", gpus=())
        probe, cluster = run_xids(arena, record(1, XID79), tmp_path)
        assert probe.result["counts"] == {} and probe.result["gpus"] == []
        assert_nothing_reported(cluster)
        [line] = refusals(probe)
        assert "GPU 0000:3b:00 is not on this node (sysfs lists 0 GPU(s))" in str(
            line["reason"])

    def test_real_gpus_with_every_xid_code_stay_under_the_cap(
            self, arena: SmallArena, tmp_path: Path) -> None:
        codes = range(1, 1500)
        lines = b"".join(record(i, f"NVRM: Xid (PCI:{REAL_GPUS[i % 3]}): {code}, x")
                         for i, code in enumerate(codes, start=1))
        probe, _ = run_xids(arena, lines, tmp_path)
        series = sum(len(c) for c in probe.result["counts"].values())
        assert series == MAX_SERIES == 1024
        assert probe.result["dropped"] == len(codes) - MAX_SERIES
        assert any(e.get("event") == "GPU Xids not counted: too many (GPU, Xid) pairs"
                   for e in probe.events)
